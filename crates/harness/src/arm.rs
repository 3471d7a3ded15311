//! The arm lifecycle shared by every command (placeholder while the move lands).
