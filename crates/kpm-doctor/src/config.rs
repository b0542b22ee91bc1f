//! What is wrong with a doctor's configuration: each setting is checked
//! once, where its config is made (`try_new`), and named when refused.

/// A doctor's setting out of range, named by its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The value is outside what the field takes.
    #[error("{field} = {value} is out of range: it must be {expected}")]
    OutOfRange {
        /// The field, as `config.field`.
        field: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
}
