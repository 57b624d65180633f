//! `kvsim canary`'s command-line arguments: the server, the load and the report.
//! The line endpoint's canary has its own ([`super::line`]).

use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct CanaryArgs {
    /// The server's base URL (`http://HOST:PORT`).
    #[arg(long)]
    pub url: String,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Short marked requests per round.
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Over-length prompts per round (sent after the short ones).
    #[arg(long, default_value_t = 4)]
    pub over_length: usize,
    /// Share of requests whose client disconnects before the reply (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub disconnect_rate: f64,
    /// Seed of the markers and the disconnect points.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keep running rounds for this many seconds (one round without it).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Tokens of a short prompt.
    #[arg(long, default_value_t = 32)]
    pub prompt_tokens: usize,
    /// `max_new_tokens` of every request. Each new token of a reply echoes one prompt
    /// position, spread evenly over the prompt, so more new tokens read more of an
    /// over-length prompt's pages (and make a leak likelier to show in the reply).
    #[arg(long, default_value_t = 8)]
    pub max_new_tokens: u32,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Seconds to wait for one reply.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Which API to send through: SGLang's `/generate` or the OpenAI API's
    /// `/v1/completions` (the model is the first of `/v1/models`).
    #[arg(long, value_enum, default_value_t = Api::Sglang)]
    pub api: Api,
}

/// The API a canary speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    Sglang,
    Openai,
}
