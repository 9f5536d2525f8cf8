#!/usr/bin/env bash
# Citus for `make test-citus`: the machine's own when the server's pkglibdir has citus.so,
# otherwise built from the source tarball named by CITUS_SRC (and installed into that server).
# Prints one line saying which; exits 3 when no Citus could be had, with the reason.
set -euo pipefail
BINDIR="$1"
PG_CONFIG="$BINDIR/pg_config"
say() { echo "test-citus: $*" >&2; }
if [ ! -x "$PG_CONFIG" ]; then
    say "no pg_config beside the server in $BINDIR: cannot find or build Citus"
    exit 3
fi
PKGLIBDIR="$("$PG_CONFIG" --pkglibdir)"
if [ -f "$PKGLIBDIR/citus.so" ]; then
    say "using the machine's Citus ($PKGLIBDIR/citus.so)"
    exit 0
fi
if [ -z "${CITUS_SRC:-}" ]; then
    say "no citus.so in $PKGLIBDIR and CITUS_SRC is not set: no Citus to test against"
    exit 3
fi
if [ ! -f "$CITUS_SRC" ]; then
    say "CITUS_SRC=$CITUS_SRC: no such file"
    exit 3
fi
if [ "$(id -u)" != 0 ]; then
    say "building Citus needs root (apt packages, make install into $PKGLIBDIR)"
    exit 3
fi
# Debian's build packages: the server headers pinned to the installed server's version.
major="$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')"
server_version="$(dpkg-query -W -f='${Version}' "postgresql-$major" 2>/dev/null || true)"
headers="postgresql-server-dev-$major${server_version:+=$server_version}"
packages=("$headers" libkrb5-dev liblz4-dev libzstd-dev)
installed="$(dpkg-query -W -f='${Status}\n' "${packages[@]%%=*}" 2>/dev/null | grep -c "ok installed" || true)"
if [ "$installed" != "${#packages[@]}" ]; then
    say "installing ${packages[*]}"
    { apt-get update -qq && apt-get install -y -q --no-install-recommends "${packages[@]}"; } \
        >/tmp/outbox-citus-apt.log 2>&1 || {
        say "apt-get could not install the build packages (see /tmp/outbox-citus-apt.log)"
        exit 3
    }
fi
work="$(mktemp -d /tmp/outbox-citus-build.XXXXXX)"
trap 'rm -rf "$work"' EXIT
say "building Citus from $CITUS_SRC (about 2 minutes on 2 cores)"
tar -xzf "$CITUS_SRC" -C "$work" --strip-components=1
(
    cd "$work"
    ./configure PG_CONFIG="$PG_CONFIG" --without-libcurl >build.log 2>&1
    make -j"$(nproc)" with_llvm=no >>build.log 2>&1
    make install with_llvm=no >>build.log 2>&1
) || {
    cp "$work/build.log" /tmp/outbox-citus-build.log 2>/dev/null || true
    say "the Citus build failed (see /tmp/outbox-citus-build.log)"
    exit 3
}
say "built and installed Citus into $PKGLIBDIR"
