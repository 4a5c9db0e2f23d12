//! The subcommands of the `leasehold` tool.

pub mod child;
pub mod demo;
pub mod worker;
