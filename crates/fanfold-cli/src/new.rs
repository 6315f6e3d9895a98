//! `fanfold new` and `fanfold ask`: their arguments. Drafting the spec
//! folder from a question and an input is `fanfold_draft`'s, which the
//! Python package shares.

use std::path::PathBuf;

pub use fanfold_draft::write;

#[derive(clap::Args)]
pub struct NewArgs {
    /// The folder to write the spec into (created; must not hold a spec).
    pub dir: PathBuf,
    /// The question, in words.
    #[arg(long)]
    pub question: String,
    /// The input: a JSON array, JSON lines, CSV, a text or log file, an
    /// e-mail or mbox, Markdown, or a folder of e-mails, Markdown, code
    /// or text files.
    #[arg(long)]
    pub input: PathBuf,
}

#[derive(clap::Args)]
pub struct AskArgs {
    /// The question, in words.
    pub question: String,
    /// The input: a JSON array, JSON lines, CSV, a text or log file, an
    /// e-mail or mbox, Markdown, or a folder of e-mails, Markdown, code
    /// or text files.
    #[arg(long)]
    pub input: PathBuf,
    /// Where the spec folder goes; `.fanfold/ask/<name>` by default.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run on this backend of the spec (`default`, the embedded model, or
    /// `scripted`, the keyword judge).
    #[arg(long, default_value = "default")]
    pub backend: String,
}
