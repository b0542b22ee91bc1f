//! `/metrics` of the real `kpm run`, scraped by several scrapers at once
//! while plugins come and go: every scrape is whole `OpenMetrics` text with its
//! content type, counters never go back, and the scrape-time gauges never
//! lose a plugin that stays registered throughout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kpm_registrar::{CSI_PLUGIN, DEVICE_PLUGIN, Registrar};
use kpm_test_support::DEADLINE;
use kpm_test_support::{http, prometheus};
use support::{Kpm, wait_until};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const SCRAPERS: usize = 4;
const ROUNDS: usize = 6;
/// Plugins of each type created and removed in each round.
const PER_TYPE: usize = 2;

/// One `/metrics` response: its content type and its families by name, each
/// with its type and samples.
struct Scrape {
    content_type: String,
    families: HashMap<String, Family>,
}

#[derive(Default)]
struct Family {
    kind: String,
    samples: HashMap<String, f64>,
}

impl Scrape {
    /// `GET /metrics` on `addr`; checks the text and splits it into families.
    fn get(addr: &str) -> Self {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let answer = http::request(&mut stream, "GET", "/metrics", "").unwrap();
        assert_eq!(answer.code, 200, "{answer:?}");
        let content_type = answer.header("content-type");
        let content_type = content_type.unwrap_or_else(|| panic!("no content type in {answer:?}"));
        Self { content_type: content_type.to_owned(), families: families(&answer.body) }
    }

    fn family(&self, name: &str) -> &Family {
        self.families.get(name).unwrap_or_else(|| panic!("no family {name}"))
    }

    fn value(&self, family: &str, series: &str) -> Option<f64> {
        self.families.get(family)?.samples.get(series).copied()
    }
}

/// The families of `OpenMetrics` text: every sample follows the `# TYPE` of
/// its family, no series appears twice, and the text ends with `# EOF`.
fn families(text: &str) -> HashMap<String, Family> {
    assert!(text.ends_with("# EOF\n"), "not whole OpenMetrics text:\n{text}");
    // Line by line: names, labels and values are well formed.
    let series_count = prometheus::values(text).len();
    let mut families = HashMap::<String, Family>::new();
    let mut current = None;
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let (name, kind) = declared.split_once(' ').unwrap();
            let family = Family { kind: kind.to_owned(), samples: HashMap::new() };
            assert!(families.insert(name.to_owned(), family).is_none(), "{name} twice:\n{text}");
            current = Some(name.to_owned());
        } else if !line.starts_with('#') {
            let name = current.as_deref().unwrap_or_else(|| panic!("{line} before any TYPE"));
            assert!(line.starts_with(name), "{line} is not in family {name}");
            let (series, value) = line.rsplit_once(' ').unwrap();
            let samples = &mut families.get_mut(name).unwrap().samples;
            assert!(samples.insert(series.to_owned(), value.parse().unwrap()).is_none());
        }
    }
    let sampled: usize = families.values().map(|family| family.samples.len()).sum();
    assert_eq!(sampled, series_count, "a series twice:\n{text}");
    families
}

/// Counters and histograms only grow: every series of `before` is in `after`
/// with a value at least as large.
fn assert_monotone(before: &Scrape, after: &Scrape) {
    for (name, family) in &before.families {
        if !["counter", "histogram"].contains(&family.kind.as_str()) {
            continue;
        }
        for (series, value) in &family.samples {
            let now = after.value(name, series);
            assert!(now.is_some_and(|now| now >= *value), "{series} went from {value} to {now:?}");
        }
    }
}

/// The state series of `socket` in `plugin_manager_total_plugins`.
fn plugin_series(socket: &str, state: &str) -> String {
    format!("plugin_manager_total_plugins{{socket_path=\"{socket}\",state=\"{state}\"}}")
}

/// What every scrape must show, however the churn stands.
fn assert_consistent(scrape: &Scrape, stable_socket: &str) {
    assert_eq!(scrape.content_type, OPENMETRICS);
    let plugins = scrape.family("plugin_manager_total_plugins");
    assert_eq!(plugins.kind, "gauge");
    for state in ["desired_state_of_world", "actual_state_of_world"] {
        let series = plugin_series(stable_socket, state);
        assert_eq!(plugins.samples.get(&series), Some(&1.0), "{series} missing");
    }
    assert!(plugins.samples.values().all(|value| value.total_cmp(&1.0).is_eq()));
    let healthy = "kpm_device_plugin_devices{resource=\"example.com/stable\",health=\"healthy\"}";
    assert_eq!(scrape.value("kpm_device_plugin_devices", healthy), Some(2.0));
    for gauge in ["kpm_operations", "kpm_tokio_tasks", "kpm_heap_allocated_bytes"] {
        assert_eq!(scrape.family(gauge).kind, "gauge");
    }
    for counter in ["kpm_backoff_skips", "kpm_watcher_rescans", "kpm_registrations"] {
        assert_eq!(scrape.family(counter).kind, "counter");
    }
}

/// Serves `name` of `plugin_type` in kpm's registry with kpm-registrar's
/// stub service of that type (two healthy devices for a device plugin).
fn serve(rt: &tokio::runtime::Runtime, kpm: &Kpm, plugin_type: &str, name: &str) -> Registrar {
    let builder = Registrar::builder(plugin_type, name)
        .socket_dir(kpm.registry())
        .routes(kpm_registrar::stub::routes(plugin_type, name));
    rt.block_on(builder.serve()).unwrap()
}

/// Tells the scrapers to stop when dropped, also when the test fails.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn concurrent_scrapes_during_churn_are_whole_monotone_and_consistent() {
    let addr = kpm_test_support::free_local_addr();
    let root = tempfile::tempdir().unwrap();
    let kpm = Kpm::start_with(root.path(), &["--metrics-addr", &addr]);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();

    let stable = serve(&rt, &kpm, DEVICE_PLUGIN, "example.com/stable");
    assert!(rt.block_on(stable.wait_for_status(DEADLINE)).unwrap().plugin_registered);
    let stable_socket = stable.socket_path().display().to_string();
    wait_until("the stable plugin and its devices are scraped", || {
        let scrape = Scrape::get(&addr);
        scrape.families.contains_key("plugin_manager_total_plugins")
            && scrape
                .value(
                    "plugin_manager_total_plugins",
                    &plugin_series(&stable_socket, "actual_state_of_world"),
                )
                .is_some()
            && scrape.families.contains_key("kpm_device_plugin_devices")
    });
    assert_consistent(&Scrape::get(&addr), &stable_socket);

    let stop = AtomicBool::new(false);
    let scraping = AtomicUsize::new(0);
    std::thread::scope(|threads| {
        for _ in 0..SCRAPERS {
            threads.spawn(|| {
                let mut last = Scrape::get(&addr);
                scraping.fetch_add(1, Ordering::Relaxed);
                assert_consistent(&last, &stable_socket);
                // At least one more scrape, however soon the churn ends.
                loop {
                    let scrape = Scrape::get(&addr);
                    assert_consistent(&scrape, &stable_socket);
                    assert_monotone(&last, &scrape);
                    last = scrape;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            });
        }
        let _stop = StopOnDrop(&stop);
        wait_until("every scraper scrapes", || scraping.load(Ordering::Relaxed) == SCRAPERS);

        // Rounds of plugins that register and go; the same names each round,
        // so that each socket path gets a new incarnation every round.
        for _ in 0..ROUNDS {
            let plugins: Vec<Registrar> = (0..PER_TYPE)
                .flat_map(|n| {
                    [
                        serve(&rt, &kpm, DEVICE_PLUGIN, &format!("example.com/churn-{n}")),
                        serve(&rt, &kpm, CSI_PLUGIN, &format!("churn-{n}.csi.example.com")),
                    ]
                })
                .collect();
            let sockets: Vec<String> =
                plugins.iter().map(|p| p.socket_path().display().to_string()).collect();
            for plugin in &plugins {
                let status = rt.block_on(plugin.wait_for_status(DEADLINE)).unwrap();
                assert!(status.plugin_registered, "{status:?}");
            }
            for plugin in plugins {
                rt.block_on(plugin.shutdown()).unwrap();
            }
            wait_until("the round's plugins are gone from both states", || {
                let plugins = Scrape::get(&addr);
                let plugins = &plugins.family("plugin_manager_total_plugins").samples;
                plugins.keys().all(|series| !sockets.iter().any(|s| series.contains(s.as_str())))
            });
        }
    });

    // Every incarnation was counted once, registered and deregistered, and
    // timed from the moment it was seen.
    let churned = f64::from(u32::try_from(ROUNDS * PER_TYPE).unwrap());
    let counted = |scrape: &Scrape, family: &str, plugin_type: &str| {
        scrape.value(family, &format!("{family}_total{{type=\"{plugin_type}\"}}"))
    };
    wait_until("every registration and deregistration is counted", || {
        let scrape = Scrape::get(&addr);
        counted(&scrape, "kpm_registrations", DEVICE_PLUGIN) == Some(churned + 1.0)
            && counted(&scrape, "kpm_registrations", CSI_PLUGIN) == Some(churned)
            && counted(&scrape, "kpm_deregistrations", DEVICE_PLUGIN) == Some(churned)
            && counted(&scrape, "kpm_deregistrations", CSI_PLUGIN) == Some(churned)
            && scrape
                .value("kpm_registration_latency_seconds", "kpm_registration_latency_seconds_count")
                == Some(2.0 * churned + 1.0)
    });
    let last = Scrape::get(&addr);
    assert_consistent(&last, &stable_socket);
    assert_eq!(last.family("plugin_manager_total_plugins").samples.len(), 2);
    rt.block_on(stable.shutdown()).unwrap();
}
