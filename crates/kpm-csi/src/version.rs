//! A CSI driver's version: apimachinery's generic version, compared
//! component by component. Parsing it, and the kubelet's rules on which
//! versions are supported, are in `version_rules`.

use std::cmp::Ordering;
use std::fmt;

/// A "generic" version as apimachinery parses it: at least two numeric
/// components, an optional leading `v`, trailing text ignored.
///
/// Ordering compares component by component, a missing component counting as
/// 0, so `1.0` and `1.0.0` are equal (and compare equal with `==`). Displays
/// as the parsed components joined with dots: `v1.2.3-rc1` shows as `1.2.3`.
#[derive(Debug, Clone)]
pub struct Version {
    components: Vec<u64>,
}

impl Version {
    /// A version of these components (at least two: the parser checks).
    pub(crate) fn from_components(components: Vec<u64>) -> Self {
        Self { components }
    }

    /// The numeric components, as parsed (at least two).
    pub fn components(&self) -> &[u64] {
        &self.components
    }

    /// The first component.
    pub fn major(&self) -> u64 {
        self.component(0)
    }

    /// The second component.
    pub fn minor(&self) -> u64 {
        self.component(1)
    }

    fn component(&self, index: usize) -> u64 {
        self.components.get(index).copied().unwrap_or(0)
    }
}

/// As its [`Display`](fmt::Display) form: `"1.2.3"`.
#[cfg(feature = "serde")]
impl serde::Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, component) in self.components.iter().enumerate() {
            if index > 0 {
                f.write_str(".")?;
            }
            write!(f, "{component}")?;
        }
        Ok(())
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let len = self.components.len().max(other.components.len());
        (0..len)
            .map(|index| self.component(index).cmp(&other.component(index)))
            .find(|ordering| ordering.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}
