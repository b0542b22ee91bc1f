//! The checks of a rendering, on the bases' manifests as written (what
//! `kubectl kustomize` gives for a base that only lists them) and on
//! copies of them broken one way at a time, so that they run where kubectl
//! is missing too.

use super::*;
use crate::command::project_root;

fn base_objects(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(project_root().join(file)).unwrap();
    parse_documents(&text).unwrap()
}

fn base_expectations(daemonset: &'static str) -> Expected {
    Expected {
        namespace: BASE_NAMESPACE.to_owned(),
        image: format!("{IMAGE}:{}", kpm_version(&project_root()).unwrap()),
        daemonsets: vec![daemonset],
        run_root: DEFAULT_ROOT.to_owned(),
        doctor_root: None,
        plugin_condition: None,
    }
}

/// The pod spec of DaemonSet `daemonset` in `objects`.
fn pod_of<'a>(objects: &'a mut [Value], daemonset: &str) -> &'a mut Value {
    let found = objects
        .iter_mut()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == daemonset)
        .unwrap();
    &mut found["spec"]["template"]["spec"]
}

#[test]
fn the_base_manifests_hold_what_the_bases_must() {
    let run = base_objects("deploy/run/daemonset.yaml");
    assert_eq!(check_rendering(&run, &base_expectations(RUN)), Vec::<String>::new());
    let doctor = base_objects("deploy/doctor/daemonset.yaml");
    assert_eq!(check_rendering(&doctor, &base_expectations(DOCTOR)), Vec::<String>::new());
}

#[test]
fn a_binding_whose_subject_kept_its_namespace_is_reported() {
    let mut objects = base_objects("deploy/run/daemonset.yaml");
    for object in &mut objects {
        if object["kind"] != "ClusterRoleBinding" {
            object["metadata"]["namespace"] = "kpm-system".into();
        }
    }
    let expected = Expected { namespace: "kpm-system".to_owned(), ..base_expectations(RUN) };
    assert_eq!(
        check_rendering(&objects, &expected),
        [
            "ClusterRoleBinding kpm binds ServiceAccount \"kpm\" of namespace \"kube-system\", not kpm-system"
        ]
    );
}

#[test]
fn a_kubelet_root_missing_from_one_place_is_reported() {
    let mut objects = base_objects("deploy/run/daemonset.yaml");
    let pod = pod_of(&mut objects, RUN);
    pod["volumes"][0]["hostPath"]["path"] = "/var/lib/k0s/kubelet".into();
    pod["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|var| var["name"] == ROOT_ENV)
        .unwrap()["value"] = "/var/lib/k0s/kubelet".into();
    let expected =
        Expected { run_root: "/var/lib/k0s/kubelet".to_owned(), ..base_expectations(RUN) };
    let problems = check_rendering(&objects, &expected);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("DaemonSet kpm: its mountPath is "), "{problems:?}");
}

#[test]
fn a_doctor_mounting_the_default_root_or_told_a_root_is_reported() {
    let mut objects = base_objects("deploy/doctor/daemonset.yaml");
    let pod = pod_of(&mut objects, DOCTOR);
    pod["volumes"].as_array_mut().unwrap().push(serde_json::json!({
        "name": "plugins-registry",
        "hostPath": {"path": "/var/lib/kubelet/plugins_registry", "type": "Directory"},
    }));
    pod["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": ROOT_ENV, "value": DEFAULT_ROOT}));
    let problems = check_rendering(&objects, &base_expectations(DOCTOR));
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("mounts [\"/var/lib/kubelet/plugins_registry\"]"), "{problems:?}");
    assert!(
        problems[1].contains("KPM_ROOT_DIR is Some(String(\"/var/lib/kubelet\"))"),
        "{problems:?}"
    );
}

#[test]
fn another_image_and_an_applied_root_config_map_are_reported() {
    let mut objects = base_objects("deploy/doctor/daemonset.yaml");
    pod_of(&mut objects, DOCTOR)["containers"][0]["image"] = "ghcr.io/kpm-rs/kpm:0.0.9".into();
    objects.push(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kpm-kubelet-root-5f2kg9", "namespace": BASE_NAMESPACE},
        "data": {"dir": "/data/kubelet"},
    }));
    let problems = check_rendering(&objects, &base_expectations(DOCTOR));
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("ConfigMap kpm-kubelet-root-5f2kg9 would be applied"),
        "{problems:?}"
    );
    assert!(problems[1].contains("runs image \"ghcr.io/kpm-rs/kpm:0.0.9\""), "{problems:?}");
}

#[test]
fn the_overlay_says_what_to_expect() {
    let kustomization = "namespace: ops\n\
        images:\n  - name: busybox\n    newTag: '1'\n  - name: ghcr.io/kpm-rs/kpm\n    newName: r.example/kpm\n    newTag: v2\n\
        configMapGenerator:\n  - name: other\n    literals: [dir=/nowhere]\n  - name: kpm-kubelet-root\n    literals: [x=1, dir=/data/kubelet]\n";
    let expected = overlay_expectations(kustomization).unwrap();
    assert_eq!(expected.namespace, "ops");
    assert_eq!(expected.image, "r.example/kpm:v2");
    assert_eq!(expected.run_root, "/data/kubelet");
    assert_eq!(expected.doctor_root.as_deref(), Some("/data/kubelet"));
    let without_root = "namespace: ops\nimages:\n  - {name: ghcr.io/kpm-rs/kpm, newName: r.example/kpm, newTag: v2}\n";
    let err = overlay_expectations(without_root).unwrap_err().to_string();
    assert!(err.contains("sets no kpm-kubelet-root literal dir="), "{err}");
}

#[test]
fn the_readiness_rules_gate_on_the_plugins_condition_with_a_taint_the_controller_takes() {
    const SPEC: &str = "example.com/dev=example.com/dev-PluginRegistered";
    // The rules as the component's replacement leaves them.
    let text = std::fs::read_to_string(project_root().join("deploy/readiness/rules.yaml"))
        .unwrap()
        .replace("PLUGIN-CONDITION-TYPE", "example.com/dev-PluginRegistered");
    let rules = parse_documents(&text).unwrap();
    let mut problems = Vec::new();
    check_readiness_rules(&rules, SPEC, &mut problems);
    assert_eq!(problems, Vec::<String>::new());
    let mut broken = rules.clone();
    broken[0]["spec"]["taint"]["key"] = "example.com/not-ready".into();
    broken[1]["spec"]["conditions"][0]["type"] = "KubeletPluginsHealthy".into();
    let mut problems = Vec::new();
    check_readiness_rules(&broken, SPEC, &mut problems);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("\"example.com/not-ready\""), "{problems:?}");
    assert!(problems[1].contains("requires"), "{problems:?}");
}
