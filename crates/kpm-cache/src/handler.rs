//! The contract between the plugin manager and the handler of a plugin type.

use async_trait::async_trait;

/// The error a handler returns; its text is sent to the plugin in
/// `NotifyRegistrationStatus(false, ..)`, so it should say what is wrong.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a plugin type does when plugins of that type come and go.
///
/// For one registration socket the calls are strictly sequential:
/// `validate` → `register` → (later) `deregister`. Two sockets that report the
/// same plugin name are independent registrations; a handler that keeps one
/// instance per name (CSI) decides between them, one that keeps several (DRA,
/// device plugins) tells them apart by `endpoint`.
#[async_trait]
pub trait PluginHandler: Send + Sync + 'static {
    /// Checks that the plugin can be registered. No side effects.
    async fn validate(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError>;

    /// Registers the plugin. On error nothing may stay registered.
    async fn register(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError>;

    /// Forgets the plugin registered under `name` at `endpoint`. Called exactly
    /// once per successful `register`; cannot fail.
    async fn deregister(&self, name: &str, endpoint: &str);
}

/// Handlers are opaque; this lets structs holding them derive `Debug`.
impl std::fmt::Debug for dyn PluginHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dyn PluginHandler")
    }
}
