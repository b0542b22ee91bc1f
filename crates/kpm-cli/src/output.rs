//! What the one-shot commands (`list`, `doctor`, `check`, `probe`) print:
//! a document as a table or as JSON, written to stdout in one piece.

use std::io::Write as _;

use clap::ValueEnum;

use crate::error::CliError;

/// `-o table|json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    Table,
    Json,
}

impl OutputFormat {
    /// `document` in this format: what `table` makes of it, or pretty JSON
    /// ending in a newline.
    pub(crate) fn render<T: serde::Serialize>(
        self,
        document: &T,
        table: impl FnOnce(&T) -> String,
    ) -> Result<String, CliError> {
        match self {
            Self::Table => Ok(table(document)),
            Self::Json => {
                let mut json = serde_json::to_string_pretty(document)
                    .map_err(|err| CliError::Output(std::io::Error::other(err)))?;
                json.push('\n');
                Ok(json)
            }
        }
    }
}

/// Writes `text` to stdout at once.
pub(crate) fn print(text: &str) -> Result<(), CliError> {
    std::io::stdout().lock().write_all(text.as_bytes()).map_err(CliError::Output)
}
