//! The crate's plugin held to kpm's conformance suite in its own `cargo
//! test`, as a driver's CI holds its driver: conformant, it passes; told to
//! misbehave, `assert_conformant` fails naming the check and its evidence.

use kpm_conformance::{Check, Config, Mark, Suite};

/// The plugin's command: a device plugin of three devices, offering what
/// the suite can check.
fn plugin(misbehaviour: Option<&str>) -> Config {
    let mut command = vec![
        env!("CARGO_BIN_EXE_example_plugin"),
        "--dir",
        "{registry}",
        "--name",
        "vendor.com/gpu",
        "--devices",
        "3",
        "--preferred-allocation",
        "--pre-start-required",
    ];
    if let Some(misbehaviour) = misbehaviour {
        command.extend(["--misbehave", misbehaviour]);
    }
    // The example plugin turns a device unhealthy on SIGUSR1.
    Config::new(command).health_change("kill -USR1 $KPM_CHECK_PID")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_plugin_conforms() {
    let report = Suite::try_new(plugin(None)).unwrap().run().await.unwrap();
    report.assert_conformant();
    let health = report.outcome(Check::HealthChange).map(|outcome| outcome.mark());
    assert_eq!(health, Some(Mark::Pass), "{}", report.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_misbehaving_plugin_fails_with_the_check_named() {
    let report = Suite::try_new(plugin(Some("stream-ends"))).unwrap().run().await.unwrap();
    assert!(!report.conformant(), "{}", report.text());
    let failed = std::panic::catch_unwind(|| report.assert_conformant())
        .expect_err("assert_conformant passes a plugin that fails a check");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("stream stays open: the plugin ended the ListAndWatch stream"),
        "{message}"
    );
}
