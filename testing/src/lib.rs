//! Test support for config-snapshot, kept out of the product: a
//! development dependency of the host's tests and benchmarks, never of a
//! release build.
//!
//! [`standin`]: the one stand-in Kubernetes API server, over the replay
//! cluster's store. Plain, it is an API server's registry (versions, uids,
//! generations, preconditions, immutability, watches). Simulating, its
//! writes go through the simulator's write path too: the webhook (serve's
//! admission), the controllers, the garbage collector. Either way serve's
//! kube-rs client talks to it as to kube-apiserver.

pub mod layering;
pub mod standin;
