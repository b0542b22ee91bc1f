//! The certificates and keys of a test cluster, made with rcgen.

use crate::command::Result;

/// The certificates and keys of a cluster, PEM-encoded.
pub(crate) struct Pki {
    pub(crate) ca: String,
    pub(crate) serving_cert: String,
    pub(crate) serving_key: String,
    pub(crate) sa_key: String,
    pub(crate) sa_public_key: String,
}

impl Pki {
    /// The serving certificate names 127.0.0.1, localhost and `extra_names`.
    pub(crate) fn generate(extra_names: &[&str]) -> Result<Self> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "kpm kube-e2e CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
        // An IP address among the names becomes an IP SAN.
        let names = ["127.0.0.1", "localhost"].iter().chain(extra_names);
        let mut serving =
            CertificateParams::new(names.map(|name| (*name).to_owned()).collect::<Vec<_>>())?;
        serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate()?;
        let serving = serving.signed_by(&serving_key, &ca)?;
        let sa_key = KeyPair::generate()?;
        Ok(Self {
            ca: ca.pem(),
            serving_cert: serving.pem(),
            serving_key: serving_key.serialize_pem(),
            sa_key: sa_key.serialize_pem(),
            sa_public_key: sa_key.public_key_pem(),
        })
    }
}
