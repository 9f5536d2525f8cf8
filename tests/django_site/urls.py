"""One route: POST /orders/<id> places an order (views.place)."""

from __future__ import annotations

from django.urls import path

from django_site.views import place

urlpatterns = [path("orders/<str:order_id>", place)]
