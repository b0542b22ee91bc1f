//! End-to-end tests of the kpm library live in `tests/tests/`: the plugin
//! manager with its real watcher, reconciler and executor, and real plugins
//! on Unix sockets. The `kpm` binary's own end-to-end tests are in
//! `crates/kpm-cli/tests`, where cargo provides the binary's path.
