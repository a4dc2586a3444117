//! See DESIGN.md §11.
