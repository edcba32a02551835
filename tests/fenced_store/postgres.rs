//! PostgreSQL: see the binary's docs.
