//! temp
use kpm_api::registration::v1::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use std::time::{Duration, Instant};
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let r = kpm_registrar::Registrar::builder("DevicePlugin", "vendor.com/gpu")
        .socket_dir(dir.path())
        .serve()
        .await
        .unwrap();
    let socket = r.socket_path().to_path_buf();
    let mut samples = Vec::new();
    for i in 0..3000 {
        let t = Instant::now();
        let ch = kpm_api::uds::dial(&socket, Duration::from_secs(5)).await.unwrap();
        let mut c = RegistrationClient::new(ch);
        c.get_info(InfoRequest {}).await.unwrap();
        c.notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
        if i >= 500 {
            samples.push(t.elapsed());
        }
    }
    samples.sort();
    println!("p50 {:?} p90 {:?}", samples[samples.len() / 2], samples[samples.len() * 9 / 10]);
}
