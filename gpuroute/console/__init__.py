"""What commands print for people: tables and progress lines (no tier's logic)."""
