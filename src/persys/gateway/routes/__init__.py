"""The REST routes, one module per resource; `persys.gateway.app` includes them in this order
(the order fixes how the OpenAPI document lists the paths)."""
