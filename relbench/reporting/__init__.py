"""Reporting: tables and report.md (report), the headline table and its notes (overview), and
the plots (plots)."""
