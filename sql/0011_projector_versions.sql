-- Projector versions (S29): `@app.projector("roster", version=2, ...)` is a new track of the
-- projector `roster`, keyed `roster@v2` wherever a projector's name keys a row (checkpoints,
-- markers, holds, pauses, this record); version 1 keeps the bare name, so every projector
-- recorded before is its own version 1. A version catches up beside the live one and is made
-- live in one step (`maintenance projector-promote`); readers ask which version is live
-- (`outbox_live_version`). A version below the live one is superseded: owed no work.

-- The declared name and the version are read off the key (a declared name never ends in
-- `@vN`), never written: a worker of the release before versions, still running during a
-- rolling upgrade, records its projectors without them, and they are its version 1.
ALTER TABLE outbox_projectors
    ADD COLUMN base text NOT NULL
        GENERATED ALWAYS AS (regexp_replace(projector, '@v[0-9]+$', '')) STORED,
    ADD COLUMN version integer NOT NULL
        GENERATED ALWAYS AS (coalesce(substring(projector FROM '@v([0-9]+)$')::integer, 1)) STORED
        CONSTRAINT outbox_projectors_version_check CHECK (version >= 1),
    ADD CONSTRAINT outbox_projectors_base_version_key UNIQUE (base, version);

-- The live version of each projector (by its declared name): made by the first record of any
-- of its versions (the lowest recorded then), moved only by a promotion (audited).
CREATE TABLE outbox_projector_live (
    projector   text        PRIMARY KEY,
    version     integer     NOT NULL CONSTRAINT outbox_projector_live_version_check
                                CHECK (version >= 1),
    promoted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    promoted_by text        NOT NULL
);
INSERT INTO outbox_projector_live (projector, version, promoted_by)
SELECT DISTINCT base, 1, 'migration 0011' FROM outbox_projectors;

-- Each recorded version with its state: `live`, `superseded` (below the live version: owed no
-- work, its holds gone) or `building` (above it: catching up, or caught up and waiting for its
-- promotion). A projector with no live row reads as version 1 live.
CREATE VIEW outbox_projector_versions AS
SELECT p.projector, p.base, p.version, coalesce(l.version, 1) AS live_version,
       CASE WHEN p.version = coalesce(l.version, 1) THEN 'live'
            WHEN p.version < coalesce(l.version, 1) THEN 'superseded'
            ELSE 'building' END AS state,
       l.promoted_at, l.promoted_by
FROM outbox_projectors p
LEFT JOIN outbox_projector_live l ON l.projector = p.base;

ALTER TABLE outbox_projector_audit
    DROP CONSTRAINT outbox_projector_audit_action_check,
    ADD CONSTRAINT outbox_projector_audit_action_check
        CHECK (action IN ('pause', 'resume', 'retire', 'promote'));
