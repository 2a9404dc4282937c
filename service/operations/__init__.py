"""Operations: table maintenance, export-safe retention, status, and the demo."""
