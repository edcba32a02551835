//! Redis: see the binary's docs.
