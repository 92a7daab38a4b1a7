"""Teaching: the course's figure style, widgets, the committed figures and the source post's numbers."""
