//! A node agent that does what `kpm run` does, minus the status API: it
//! registers CSI drivers, device plugins and DRA drivers from
//! `<root>/plugins_registry`, serves `kubelet.sock`, and prints what happens.
//!
//! `cargo run -p kpm --example node_agent -- /tmp/kubelet` (default root:
//! `/var/lib/kubelet`), then stop it with Ctrl-C.

use kpm::Kubelet;
use tokio::sync::broadcast::error::RecvError;

#[tokio::main]
async fn main() -> Result<(), kpm::Error> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let root = std::env::args().nth(1).unwrap_or_else(|| kpm::api::DEFAULT_ROOT_DIR.to_owned());
    let kubelet = Kubelet::builder().root_dir(root).build()?;

    let mut events = kubelet.handle().manager().subscribe();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(event) => println!("{event:?}"),
                Err(RecvError::Lagged(missed)) => println!("({missed} events missed)"),
                Err(RecvError::Closed) => break,
            }
        }
    });

    kubelet.run(async { tokio::signal::ctrl_c().await.unwrap_or_default() }).await
}
