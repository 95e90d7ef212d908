"""The read API over either layout, its queries and parameters, and the page."""
