//! The DRA scenario: two instances of a kubeletplugin driver in a rolling
//! update.

use std::path::Path;

use super::processes::{spawn, start_kpm, wait_for_list};
use super::{Env, STEP_TIMEOUT, STOP_TIMEOUT};
use crate::command::Result;
use crate::scenario::find;

pub(super) fn dra_rolling_update(env: &Env, root: &Path) -> Result {
    let kpm = start_kpm(env, root, "dra-rolling-update")?;
    let bin = env.bin_dir.join("dra-kubeletplugin");
    let instance = |uid: &str| {
        let name = format!("dra-kubeletplugin-{uid}");
        spawn(
            env,
            "dra-rolling-update",
            &name,
            &bin,
            &[
                "--driver-name",
                "dra.example.com",
                "--node-name",
                "node-1",
                "--registrar-dir",
                &root.join("plugins_registry").display().to_string(),
                "--plugin-dir",
                &root.join("plugins/dra.example.com").display().to_string(),
                "--uid",
                uid,
            ],
        )
    };
    let endpoints = |list: &serde_json::Value| -> Vec<String> {
        find(&list["dra_drivers"], "name", "dra.example.com")
            .and_then(|driver| driver["instances"].as_array())
            .map(|instances| {
                instances.iter().filter_map(|i| i["endpoint"].as_str().map(str::to_owned)).collect()
            })
            .unwrap_or_default()
    };
    let mut old = instance("1111")?;
    old.wait_for_line("the helper told registered", STEP_TIMEOUT, |line| {
        line == "registration status: true"
    })?;
    let mut new = instance("2222")?;
    new.wait_for_line("the helper told registered", STEP_TIMEOUT, |line| {
        line == "registration status: true"
    })?;
    let both = wait_for_list(&kpm, "both instances registered", |list| {
        let endpoints = endpoints(list);
        Ok((endpoints.len() == 2).then_some(endpoints))
    })?;
    eprintln!("both instances registered: {both:?}");
    new.stop(STOP_TIMEOUT)?;
    let left = wait_for_list(&kpm, "back to the older instance", |list| {
        let endpoints = endpoints(list);
        Ok((endpoints.len() == 1 && endpoints[0].contains("1111")).then_some(endpoints))
    })?;
    eprintln!("the newer instance exited, left: {left:?}");
    old.stop(STOP_TIMEOUT)?;
    wait_for_list(&kpm, "no instance left", |list| Ok(endpoints(list).is_empty().then_some(())))?;
    kpm.stop()
}
