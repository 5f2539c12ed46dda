"""The explainer page's routes: the page and its session API (routes), the lesson's sections (sections)."""
