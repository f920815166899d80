//! Integration tests for kvbm-queue.
