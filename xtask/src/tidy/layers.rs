//! `LAYERS`: which workspace crates each crate may depend on, normal and dev
//! dependencies apart, held against every manifest both ways: a dependency
//! no layer allows is an error, and so is an allowance no manifest uses.
//! Any crate may have `kpm-test-support` as a dev-dependency, and itself
//! (for its `testing` feature), without a word in `LAYERS`.

use super::workspace::Crate;

/// The file that holds `LAYERS`, named in tidy's messages.
const HOME: &str = "xtask/src/tidy/layers.rs";

/// One crate's place: the internal crates it may depend on.
#[derive(Debug)]
pub(super) struct Layer {
    pub(super) name: &'static str,
    /// Normal (and build) dependencies; a dev-dependency on one of these is
    /// allowed too, as cargo lets tests use what the library uses.
    pub(super) deps: &'static [&'static str],
    /// Dev-dependencies only: what the crate's tests, examples and benches
    /// use and its library must not.
    pub(super) dev: &'static [&'static str],
}

/// A layer with normal dependencies only.
const fn normal(name: &'static str, deps: &'static [&'static str]) -> Layer {
    Layer { name, deps, dev: &[] }
}

/// Which internal crates each workspace crate may depend on, as the
/// dependency list of `docs/ARCHITECTURE.md` states them, in the same order.
/// Tidy fails on a crate missing here, on a name here that is no workspace
/// crate, on a manifest that says otherwise, and on an allowance no manifest
/// uses, so that the table, the manifests and ARCHITECTURE.md change
/// together.
pub(super) const LAYERS: &[Layer] = &[
    // The wire: generated code and constants, no IO.
    normal("kpm-api", &[]),
    normal("kpm-transport", &["kpm-api"]),
    normal("kpm-cache", &["kpm-api"]),
    normal("kpm-executor", &["kpm-api", "kpm-transport", "kpm-cache"]),
    normal("kpm-watcher", &["kpm-api", "kpm-cache"]),
    normal("kpm-liveness", &["kpm-api", "kpm-transport", "kpm-cache"]),
    // The transport only for its tests' plugins.
    Layer {
        name: "kpm-reconciler",
        deps: &["kpm-api", "kpm-cache", "kpm-executor"],
        dev: &["kpm-transport"],
    },
    normal("kpm-csi", &["kpm-api", "kpm-transport", "kpm-cache"]),
    normal("kpm-device", &["kpm-api", "kpm-transport", "kpm-cache"]),
    normal("kpm-dra", &["kpm-api", "kpm-transport", "kpm-cache"]),
    // Publishing to the Kubernetes API: the handlers' seams, nothing else.
    normal("kpm-kube", &["kpm-api", "kpm-csi", "kpm-device", "kpm-dra"]),
    normal("kpm-registrar", &["kpm-api", "kpm-transport"]),
    // The library: never the registrar, whose stubs are for tests and demos.
    normal(
        "kpm",
        &[
            "kpm-api",
            "kpm-transport",
            "kpm-cache",
            "kpm-executor",
            "kpm-watcher",
            "kpm-liveness",
            "kpm-reconciler",
            "kpm-csi",
            "kpm-device",
            "kpm-dra",
            "kpm-kube",
        ],
    ),
    // The doctor's report, the contract between a node's doctor and the
    // fleet: the wire's shared names only, no IO.
    normal("kpm-report", &["kpm-api"]),
    // Who serves a socket, in pods: the container runtime, read-only; its
    // words are the report crate's.
    normal("kpm-pods", &["kpm-api", "kpm-transport", "kpm-report"]),
    // What each kubelet minor does otherwise than kpm's kubelet, for the
    // doctor and the conformance suite alike: the handlers' words, and the
    // minors checked from the report crate.
    normal("kpm-minors", &["kpm", "kpm-report"]),
    // `kpm run`'s status API and metrics: the facade's status types, typed
    // once for the server and its readers; nothing of the doctor or the CLI.
    Layer { name: "kpm-status", deps: &["kpm", "kpm-api"], dev: &["kpm-registrar"] },
    // The node's diagnosis: the facade's inspection, read-only, and the API;
    // what it publishes is the report crate's; what a `kpm run` beside the
    // kubelet has not published, the status API's client.
    normal("kpm-doctor", &["kpm", "kpm-report", "kpm-pods", "kpm-minors", "kpm-status"]),
    // The conformance suite: a plugin driven by the facade's kubelet; the
    // minors' rules, and nothing of the doctor.
    // Its unit tests' scripted plugins are the registrar's stubs.
    Layer {
        name: "kpm-conformance",
        deps: &["kpm", "kpm-api", "kpm-minors"],
        dev: &["kpm-registrar"],
    },
    // The fleet reader: reports and API objects, read-only; nothing of the
    // node's doctor, nothing that reads a node's files.
    normal("kpm-fleet", &["kpm-api", "kpm-report"]),
    // The transport only through the facade's curated `kpm::transport`.
    normal(
        "kpm-cli",
        &[
            "kpm",
            "kpm-api",
            "kpm-doctor",
            "kpm-fleet",
            "kpm-registrar",
            "kpm-report",
            "kpm-conformance",
            "kpm-status",
        ],
    ),
    // The load generator of `cargo xtask bench`: plugins only, kpm runs as a
    // process, its metrics read as the tests read them.
    normal("kpm-bench", &["kpm-api", "kpm-transport", "kpm-registrar", "kpm-test-support"]),
    // End-to-end tests: nothing but tests, so every dependency is a dev one.
    Layer { name: "kpm-tests", deps: &[], dev: &["kpm", "kpm-api", "kpm-registrar"] },
    // The fake plugins (features `csi` and `registration`) speak the wire
    // on real sockets; the two crates below everything else, whose own tests
    // do not use it.
    normal("kpm-test-support", &["kpm-api", "kpm-transport"]),
    // The suites of `cargo xtask` start servers on ports taken as the tests
    // take them.
    normal("kpm-e2e", &["kpm-test-support"]),
    // The dispatch, codegen, tidy and ci: the suites are kpm-e2e's.
    normal("xtask", &["kpm-e2e"]),
];

/// The shared test helpers: any crate may have them as a dev-dependency, and
/// only the tools whose layers name it (kpm-e2e, kpm-bench) as a normal one.
pub(super) const TEST_SUPPORT: &str = "kpm-test-support";

/// Every crate's dependencies against `LAYERS`, and `LAYERS` against the
/// workspace and its manifests.
pub(super) fn check_layers(crates: &[Crate], problems: &mut Vec<String>) {
    for krate in crates {
        let Some(layer) = LAYERS.iter().find(|layer| layer.name == krate.name) else {
            problems.push(format!(
                "workspace crate {} has no entry in LAYERS ({HOME}): add one",
                krate.name
            ));
            continue;
        };
        check_crate(krate, layer, problems);
    }
    let known = |name: &str| crates.iter().any(|krate| krate.name == name);
    for layer in LAYERS {
        let name = layer.name;
        if !known(name) {
            problems.push(format!("LAYERS names {name}, which is not a workspace crate"));
        }
        for dep in layer.deps.iter().chain(layer.dev).filter(|dep| !known(dep)) {
            problems.push(format!(
                "LAYERS lets {name} depend on {dep}, which is not a workspace crate"
            ));
        }
    }
}

/// One crate's manifest against its layer, both ways.
fn check_crate(krate: &Crate, layer: &Layer, problems: &mut Vec<String>) {
    let name = &krate.name;
    for dep in &krate.deps {
        let dep_name = dep.name.as_str();
        // A dev-dependency on the crate itself turns on its `testing`
        // feature for its own tests: no edge between crates.
        let allowed = layer.deps.contains(&dep_name)
            || (dep.dev
                && (dep_name == TEST_SUPPORT
                    || dep_name == name.as_str()
                    || layer.dev.contains(&dep_name)));
        if allowed {
            continue;
        }
        let kind = if dep.dev { "a dev-dependency" } else { "a dependency" };
        let hint = if !dep.dev && layer.dev.contains(&dep_name) {
            " as a normal one (it is listed under `dev`)"
        } else {
            ""
        };
        problems.push(format!(
            "{name} has {dep_name} as {kind}, which its layer does not allow{hint} ({HOME} LAYERS)"
        ));
    }
    let uses = |dep_name: &str, dev: bool| {
        krate.deps.iter().any(|dep| dep.name == dep_name && dep.dev == dev)
    };
    for dep in layer.deps.iter().filter(|dep| !uses(dep, false)) {
        let fix =
            if uses(dep, true) { "move it to `dev`: only its tests use it" } else { "remove it" };
        problems.push(format!(
            "LAYERS lets {name} depend on {dep}, which its Cargo.toml does not: {fix} ({HOME})"
        ));
    }
    for dep in layer.dev.iter().filter(|dep| !uses(dep, true)) {
        let fix = if layer.deps.contains(dep) {
            "remove it from `dev`: it is a normal dependency already".to_owned()
        } else {
            "remove it".to_owned()
        };
        problems.push(format!(
            "LAYERS lets {name} have {dep} as a dev-dependency, which its Cargo.toml does not: \
             {fix} ({HOME})"
        ));
    }
}

/// Workspaces for the checks' tests, drawn from [`LAYERS`]: here, not in
/// `workspace`, which `layers` names and which would then name it back.
#[cfg(test)]
pub(super) mod fixtures {
    use super::LAYERS;
    use crate::tidy::workspace::{Crate, Dependency};

    /// The workspace as `LAYERS` draws it, each crate with the dependencies
    /// its layer allows (normal and dev), and `extra` added to `name`'s.
    pub(in crate::tidy) fn workspace(name: &str, extra: Option<Dependency>) -> Vec<Crate> {
        let mut crates: Vec<Crate> = LAYERS
            .iter()
            .map(|layer| Crate {
                published: false,
                library: true,
                metadata: Vec::new(),
                name: layer.name.to_owned(),
                dir: format!("crates/{}", layer.name),
                deps: layer
                    .deps
                    .iter()
                    .map(|dep| self::dep(dep, false))
                    .chain(layer.dev.iter().map(|dep| self::dep(dep, true)))
                    .collect(),
            })
            .collect();
        if let Some(krate) = crates.iter_mut().find(|krate| krate.name == name) {
            krate.deps.extend(extra);
        }
        crates
    }

    pub(in crate::tidy) fn dep(name: &str, dev: bool) -> Dependency {
        Dependency { name: name.to_owned(), dev }
    }

    /// A crate that neither `LAYERS` nor ARCHITECTURE.md names.
    pub(in crate::tidy) fn unlisted_crate() -> Crate {
        Crate {
            published: false,
            library: true,
            metadata: Vec::new(),
            name: "kpm-new".to_owned(),
            dir: "crates/kpm-new".to_owned(),
            deps: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{dep, unlisted_crate, workspace};
    use super::*;
    use crate::tidy::workspace::Dependency;

    #[test]
    fn the_workspace_as_layers_draws_it_passes() {
        let mut problems = Vec::new();
        check_layers(&workspace("kpm", None), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn layering_violation_is_reported() {
        let mut problems = Vec::new();
        check_layers(&workspace("kpm-cache", Some(dep("kpm-executor", true))), &mut problems);
        assert_eq!(
            problems,
            [format!(
                "kpm-cache has kpm-executor as a dev-dependency, which its layer does not allow \
                 ({HOME} LAYERS)"
            )]
        );
    }

    #[test]
    fn a_dev_allowance_does_not_allow_a_normal_dependency() {
        let mut problems = Vec::new();
        check_layers(
            &workspace("kpm-reconciler", Some(dep("kpm-transport", false))),
            &mut problems,
        );
        assert_eq!(
            problems,
            [format!(
                "kpm-reconciler has kpm-transport as a dependency, which its layer does not \
                 allow as a normal one (it is listed under `dev`) ({HOME} LAYERS)"
            )]
        );
    }

    #[test]
    fn a_normal_dependency_may_also_be_a_dev_dependency() {
        let mut problems = Vec::new();
        check_layers(&workspace("kpm-executor", Some(dep("kpm-api", true))), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn a_crate_may_be_its_own_dev_dependency_only() {
        let mut problems = Vec::new();
        check_layers(&workspace("kpm-dra", Some(dep("kpm-dra", true))), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        check_layers(&workspace("kpm-dra", Some(dep("kpm-dra", false))), &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    #[test]
    fn test_support_is_a_dev_dependency_of_any_crate_only() {
        let mut problems = Vec::new();
        check_layers(&workspace("kpm-cache", Some(dep(TEST_SUPPORT, true))), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        check_layers(&workspace("kpm-cache", Some(dep(TEST_SUPPORT, false))), &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    /// The dependencies of crate `name` in `crates`.
    fn manifest<'a>(crates: &'a mut [Crate], name: &str) -> std::slice::IterMut<'a, Dependency> {
        crates.iter_mut().find(|krate| krate.name == name).unwrap().deps.iter_mut()
    }

    #[test]
    fn an_allowance_no_manifest_uses_is_reported() {
        let mut crates = workspace("kpm", None);
        manifest(&mut crates, "kpm-kube").for_each(|dep| {
            if dep.name == "kpm-csi" {
                dep.name = TEST_SUPPORT.to_owned();
                dep.dev = true;
            }
        });
        manifest(&mut crates, "kpm-reconciler").for_each(|dep| {
            if dep.name == "kpm-transport" {
                dep.name = TEST_SUPPORT.to_owned();
            }
        });
        // Used by tests only: the allowance belongs under `dev`.
        manifest(&mut crates, "kpm-doctor").filter(|dep| dep.name == "kpm").for_each(|dep| {
            dep.dev = true;
        });
        let mut problems = Vec::new();
        check_layers(&crates, &mut problems);
        assert_eq!(
            problems,
            [
                format!(
                    "LAYERS lets kpm-reconciler have kpm-transport as a dev-dependency, which \
                     its Cargo.toml does not: remove it ({HOME})"
                ),
                format!(
                    "LAYERS lets kpm-kube depend on kpm-csi, which its Cargo.toml does not: \
                     remove it ({HOME})"
                ),
                format!(
                    "LAYERS lets kpm-doctor depend on kpm, which its Cargo.toml does not: \
                     move it to `dev`: only its tests use it ({HOME})"
                ),
            ]
        );
    }

    #[test]
    fn layers_must_name_every_workspace_crate_and_nothing_else() {
        let mut crates = workspace("kpm", None);
        crates.push(unlisted_crate());
        crates.retain(|krate| krate.name != "kpm-dra");
        let mut problems = Vec::new();
        check_layers(&crates, &mut problems);
        assert_eq!(
            problems,
            [
                format!("workspace crate kpm-new has no entry in LAYERS ({HOME}): add one"),
                "LAYERS names kpm-dra, which is not a workspace crate".to_owned(),
                "LAYERS lets kpm-kube depend on kpm-dra, which is not a workspace crate".to_owned(),
                "LAYERS lets kpm depend on kpm-dra, which is not a workspace crate".to_owned(),
            ]
        );
    }
}
