//! The certificates and keys of a test cluster, made with rcgen.

use crate::Result;

/// The certificates and keys of a cluster, PEM-encoded.
pub(super) struct Pki {
    pub(super) ca: String,
    pub(super) serving_cert: String,
    pub(super) serving_key: String,
    pub(super) sa_key: String,
    pub(super) sa_public_key: String,
}

impl Pki {
    pub(super) fn generate() -> Result<Self> {
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
        let mut serving =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
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
