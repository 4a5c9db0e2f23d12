//! Nothing: the benchmarks are `lease_ops.rs` (`cargo bench --bench lease_ops`).
