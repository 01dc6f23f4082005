"""The browser page (``GET /``) and the operator dashboard (``GET /dashboard``): plain
HTML/JS/CSS from ``web/static/``, no build step, nothing fetched from elsewhere.
``routes`` registers them; ``paths`` says which requests they are (read by ``web/auth``)."""
