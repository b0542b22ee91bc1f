//! The contract between the plugin manager and the handler of a plugin type.

use async_trait::async_trait;

use crate::PluginDetails;

/// The error a handler returns; its text is sent to the plugin in
/// `NotifyRegistrationStatus(false, ..)`, so it should say what is wrong.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a plugin type does when plugins of that type come and go.
///
/// For one registration socket the calls are strictly sequential:
/// `validate` → `register` → (later) `deregister`. Two sockets that report the
/// same plugin name are independent registrations; a handler that keeps one
/// instance per name (CSI) decides between them, one that keeps several (DRA,
/// device plugins) tells them apart by [`PluginDetails::endpoint`]. The
/// argument is a `#[non_exhaustive]` struct so that what a handler is told
/// can grow without breaking handlers.
#[async_trait]
pub trait PluginHandler: Send + Sync + 'static {
    /// Checks that `plugin` can be registered. No side effects.
    async fn validate(&self, plugin: &PluginDetails) -> Result<(), HandlerError>;

    /// Registers `plugin`. On error nothing may stay registered.
    async fn register(&self, plugin: &PluginDetails) -> Result<(), HandlerError>;

    /// Forgets `plugin`, registered under its name at its endpoint. Called
    /// exactly once per successful `register`, with what `register` was
    /// given; cannot fail.
    async fn deregister(&self, plugin: &PluginDetails);

    /// Looks, read-only, at the plugin's own service the way `register`
    /// would use it, and says what it saw: for diagnosis (`kpm probe`,
    /// `kpm doctor`), never on the registration path. It registers
    /// nothing, changes nothing the plugin keeps, and holds no connection
    /// after it returns. An error says what fails, keeping the transport's
    /// error as a source where there is one. Default: nothing to look at.
    async fn inspect(
        &self,
        plugin: &PluginDetails,
    ) -> Result<Option<Box<dyn ServiceReport>>, HandlerError> {
        let _ = plugin;
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
