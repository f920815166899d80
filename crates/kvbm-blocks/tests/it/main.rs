//! Integration tests for kvbm-blocks.
