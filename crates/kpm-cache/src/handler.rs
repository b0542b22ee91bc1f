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

    /// Looks, read-only, at the plugin's own service the way `register`
    /// would use it, and says what it saw: for diagnosis (`kpm probe`,
    /// `kpm doctor`), never on the registration path. It registers
    /// nothing, changes nothing the plugin keeps, and holds no connection
    /// after it returns. An error says what fails, keeping the transport's
    /// error as a source where there is one. Default: nothing to look at.
    async fn inspect(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<Option<Box<dyn ServiceReport>>, HandlerError> {
        let _ = (name, endpoint, versions);
        Ok(None)
    }
}

/// What a handler saw of a plugin's own service
/// ([`PluginHandler::inspect`]): one line to show, and the handler's own
/// type for callers that know it (`(report as &dyn Any).downcast_ref()`).
pub trait ServiceReport: std::fmt::Display + std::fmt::Debug + std::any::Any + Send + Sync {}

impl<T: std::fmt::Display + std::fmt::Debug + std::any::Any + Send + Sync> ServiceReport for T {}

/// Handlers are opaque; this lets structs holding them derive `Debug`.
impl std::fmt::Debug for dyn PluginHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dyn PluginHandler")
    }
}
