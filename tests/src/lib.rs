//! End-to-end tests of the kpm library live in `tests/tests/`: the plugin
//! manager with its real watcher, reconciler and executor, and real plugins
//! on Unix sockets; the facade's `Kubelet` with a plugin of each type;
//! handlers that panic or hang; the Kubernetes publishers on kube's mock;
//! and raw HTTP/2 calls as grpc-go makes them. The `kpm` binary's own
//! end-to-end tests are in `crates/kpm-cli/tests`, where cargo provides the
//! binary's path; `faults.rs` there is the fault-injection suite.
