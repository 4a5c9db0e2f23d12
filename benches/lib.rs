//! Nothing: the benchmarks are `lease_ops.rs` (`cargo bench -p leasehold-benches`).
