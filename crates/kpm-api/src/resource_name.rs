//! Which resource names are extended resources, the names device plugins
//! advertise and Nodes carry in their capacity: one rule for the device
//! handler, the capacity kpm publishes, the doctor and the fleet reader.

/// The prefix of native (non-extended) resources with a domain.
const NATIVE_RESOURCE_PREFIX: &str = "kubernetes.io/";
/// The prefix of quota resource names; extended resources must not use it.
const REQUESTS_PREFIX: &str = "requests.";
/// Longest DNS-1123 subdomain.
const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Longest name part of a qualified name.
const QUALIFIED_NAME_MAX: usize = 63;

/// Whether `name` is an extended resource name, as the kubelet decides:
/// it contains `/`, does not contain `kubernetes.io/` (so neither
/// `kubernetes.io/x` nor `foo.kubernetes.io/x`), does not start with
/// `requests.`, and `requests.<name>` is a qualified name: a DNS-1123
/// subdomain prefix (lowercase, at most 253 characters) and a name part of at
/// most 63 characters matching `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
pub fn is_extended_resource_name(name: &str) -> bool {
    if !name.contains('/') || name.contains(NATIVE_RESOURCE_PREFIX) {
        return false;
    }
    if name.starts_with(REQUESTS_PREFIX) {
        return false;
    }
    is_qualified_name(&format!("{REQUESTS_PREFIX}{name}"))
}

/// Whether a resource quantity (`2`, `100m`, `0.5`, `2Gi`) is not zero:
/// some digit of its number is not `0`. The kubelet sets the capacity of a
/// device plugin's resource to 0 once the plugin is gone, so this is what
/// tells a registered resource on a Node.
pub fn is_nonzero_quantity(quantity: &str) -> bool {
    quantity
        .trim_start_matches(['+', '-'])
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .any(|c| c.is_ascii_digit() && c != '0')
}

/// Whether `key` may be a label key (apimachinery's `IsQualifiedName`):
/// a CSI driver's topology keys become the Node's labels.
pub fn is_label_key(key: &str) -> bool {
    is_qualified_name(key)
}

/// Whether `value` may be a label value (apimachinery's
/// `IsValidLabelValue`): empty, or a name part of at most 63 characters.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty() || is_qualified_name_part(value)
}

/// apimachinery's `IsQualifiedName`: `[prefix/]name`.
fn is_qualified_name(value: &str) -> bool {
    let mut parts = value.split('/');
    let (prefix, name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => (None, name),
        (Some(prefix), Some(name), None) => (Some(prefix), name),
        _ => return false,
    };
    if prefix.is_some_and(|prefix| !is_dns1123_subdomain(prefix)) {
        return false;
    }
    is_qualified_name_part(name)
}

/// `^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`, at most 63 characters.
fn is_qualified_name_part(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else { return false };
    bytes.len() <= QUALIFIED_NAME_MAX
        && first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && bytes.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`, at
/// most 253 characters (apimachinery's `IsDNS1123Subdomain`: a Node's name,
/// an extended resource's prefix). Labels have no length limit of their own
/// here, as there.
pub fn is_dns1123_subdomain(value: &str) -> bool {
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => {
                alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
            }
            _ => false,
        }
    };
    value.len() <= DNS1123_SUBDOMAIN_MAX && value.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_and_values_are_apimachinerys() {
        for key in ["topology.hostpath.csi/node", "zone", "a.b-c/x_y.z"] {
            assert!(is_label_key(key), "{key}");
        }
        for key in ["", "bad key", "Upper.Case/x", "a/b/c", "/x", "x/"] {
            assert!(!is_label_key(key), "{key}");
        }
        for value in ["", "node-1", "a.b_c"] {
            assert!(is_label_value(value), "{value}");
        }
        for value in ["-x", "x-", "with space", &"v".repeat(64)] {
            assert!(!is_label_value(value), "{value}");
        }
    }

    #[test]
    fn zero_quantities_are_zero() {
        for zero in ["0", "0k", "0.0", "", "+0"] {
            assert!(!is_nonzero_quantity(zero), "{zero}");
        }
        for some in ["1", "100m", "2Gi", "0.5", "10"] {
            assert!(is_nonzero_quantity(some), "{some}");
        }
    }

    /// Upstream's `IsExtendedResourceName` (pkg/apis/core/helper): not
    /// native (no `/`, or `kubernetes.io/` anywhere in the name), not a
    /// quota's `requests.` name, and `requests.<name>` a qualified name. The
    /// one rule for device registration, capacity and `kpm doctor`.
    #[test]
    fn extended_resource_names_follow_the_kubelets_rules() {
        let long_domain = |len: usize| format!("{}.com", "a".repeat(len - 4));
        let cases: Vec<(String, bool, &str)> = vec![
            ("vendor.com/gpu".into(), true, "domain and name"),
            ("example.com/gpu".into(), true, "domain and name"),
            ("example.com/nic".into(), true, "domain and name"),
            ("nvidia.com/gpu".into(), true, "a real one"),
            ("nvidia.com/mig-1g.5gb".into(), true, "a real one with . and -"),
            ("example.com/dev-1_a.b".into(), true, "name part with - _ ."),
            ("vendor.com/GPU".into(), true, "the name part may have capitals"),
            ("a/b".into(), true, "one-letter parts"),
            ("sub.domain.vendor.io/x".into(), true, "deep domain"),
            ("gpu".into(), false, "no domain"),
            ("cpu".into(), false, "native resource"),
            ("memory".into(), false, "native resource"),
            ("pods".into(), false, "native resource"),
            ("ephemeral-storage".into(), false, "native resource"),
            ("hugepages-2Mi".into(), false, "native resource"),
            ("attachable-volumes-aws-ebs".into(), false, "native resource, no domain"),
            ("attachable-volumes-csi-ebs.csi.aws.com".into(), false, "no / though dotted"),
            ("kubernetes.io/gpu".into(), false, "kubernetes.io domain"),
            ("kubernetes.io/x".into(), false, "kubernetes.io domain"),
            ("kubernetes.io/batch-cpu".into(), false, "kubernetes.io domain"),
            ("foo.kubernetes.io/gpu".into(), false, "contains kubernetes.io/"),
            ("scheduling.kubernetes.io/x".into(), false, "contains kubernetes.io/"),
            ("requests.vendor.com/gpu".into(), false, "starts with requests."),
            ("requests.example.com/x".into(), false, "starts with requests."),
            ("Vendor.com/gpu".into(), false, "capital in the domain"),
            ("vendor_com/gpu".into(), false, "underscore in the domain"),
            ("vendor..com/gpu".into(), false, "empty domain label"),
            ("-vendor.com/gpu".into(), false, "label starts with -"),
            ("vendor.com/".into(), false, "empty name part"),
            ("/gpu".into(), false, "empty domain"),
            ("vendor.com/gpu/0".into(), false, "two slashes"),
            ("vendor.com/-gpu".into(), false, "name starts with -"),
            ("vendor.com/gpu.".into(), false, "name ends with ."),
            ("vendor.com/g pu".into(), false, "space in the name"),
            ("vendor.com/gpü".into(), false, "non-ASCII name"),
            (String::new(), false, "empty"),
            (format!("vendor.com/{}", "x".repeat(63)), true, "63-character name part"),
            (format!("vendor.com/{}", "x".repeat(64)), false, "64-character name part"),
            (format!("{}/gpu", long_domain(244)), true, "requests. + domain is 253"),
            (format!("{}/gpu", long_domain(245)), false, "requests. + domain is 254"),
        ];
        for (name, valid, why) in cases {
            assert_eq!(is_extended_resource_name(&name), valid, "{why}: {name:?}");
        }
    }
}
