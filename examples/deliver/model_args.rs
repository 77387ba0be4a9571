//! The command line's choice of model: `--model` and the flags of `--model openai`.

use std::time::Duration;

use anyhow::{Result, bail};

use crate::model::{AnyModel, ScriptedModel};

/// The flags that choose and set up the model.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// The model that plans and fixes. `scripted` is an offline stand-in that knows the demo
    /// crate's two bugs and needs no network; `openai` is a client of the OpenAI-compatible
    /// chat-completions API (vLLM, llama.cpp's server, Ollama, hosted services), in builds
    /// with the `openai` feature (`cargo run -p deliver --features openai -- --model openai
    /// ...`)
    #[arg(long, value_enum, value_name = "MODEL", default_value = "scripted")]
    pub model: ModelKind,

    /// With `--model openai`: the API's base URL, what comes before /chat/completions
    /// (http://127.0.0.1:8080/v1, https://api.openai.com/v1)
    // Required only in a build that has the client: without it, `--model openai` is refused
    // first for the missing feature (by `choose`), not for flags that could not be used.
    #[arg(long, value_name = "URL")]
    #[cfg_attr(feature = "openai", arg(required_if_eq("model", "openai")))]
    base_url: Option<String>,

    /// With `--model openai`: the environment variable that holds the API key, sent as a
    /// bearer token [default: none, no key is sent]
    #[arg(long, value_name = "NAME")]
    api_key_env: Option<String>,

    /// With `--model openai`: the model to ask, as the server names it
    #[arg(long, value_name = "NAME")]
    #[cfg_attr(feature = "openai", arg(required_if_eq("model", "openai")))]
    model_name: Option<String>,

    /// With `--model openai`: how long one request may take, in seconds [default: 60]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    model_timeout: Option<Duration>,

    /// With `--model openai`: tries per model call; a 429, a 5xx, a time-out or an unusable
    /// answer is tried again, after the wait the server's Retry-After asks for (at most 60
    /// s) or a back-off [default: 4]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=20))]
    model_tries: Option<u32>,
}

/// The models `--model` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelKind {
    /// The scripted, offline stand-in.
    Scripted,
    /// A client of the OpenAI-compatible chat-completions API.
    Openai,
}

/// `--model-timeout`: a positive number of seconds, maybe with a fraction.
fn parse_seconds(text: &str) -> std::result::Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    match Duration::try_from_secs_f64(seconds) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(format!("{text:?} is not a positive number of seconds")),
    }
}

impl ModelArgs {
    /// The model these flags name.
    ///
    /// # Errors
    /// If a flag of `--model openai` is given with another model; with `--model openai`, if
    /// this build lacks the `openai` feature, the API key's variable is not set, or the
    /// client's configuration cannot work (a bad `--base-url`).
    pub fn choose(&self) -> Result<AnyModel> {
        let openai_flags = [
            ("--base-url", self.base_url.is_some()),
            ("--api-key-env", self.api_key_env.is_some()),
            ("--model-name", self.model_name.is_some()),
            ("--model-timeout", self.model_timeout.is_some()),
            ("--model-tries", self.model_tries.is_some()),
        ];
        match self.model {
            ModelKind::Scripted => {
                if let Some((flag, _)) = openai_flags.iter().find(|(_, given)| *given) {
                    bail!("{flag} is for --model openai; the scripted model takes no settings");
                }
                Ok(AnyModel::Scripted(ScriptedModel::demo()))
            }
            ModelKind::Openai => openai_model(self),
        }
    }
}

/// `--model openai` in a build without the `openai` feature: refused before any of its
/// flags is asked for (none is required in such a build), with the command that builds
/// with the feature and runs.
#[cfg(not(feature = "openai"))]
fn openai_model(_: &ModelArgs) -> Result<AnyModel> {
    bail!(
        "--model openai needs the `openai` feature, which this build lacks: build with it and \
         run, `cargo run -p deliver --features openai -- --model openai --base-url URL \
         --model-name NAME ...`"
    )
}

/// `--model openai`: the client its flags describe.
#[cfg(feature = "openai")]
fn openai_model(cli: &ModelArgs) -> Result<AnyModel> {
    let api_key = match &cli.api_key_env {
        None => None,
        Some(name) => match std::env::var(name) {
            Ok(key) if !key.trim().is_empty() => Some(key.trim().to_owned()),
            Ok(_) => bail!("--api-key-env {name}: the variable is empty"),
            Err(std::env::VarError::NotPresent) => {
                bail!("--api-key-env {name}: the variable is not set")
            }
            Err(e) => bail!("--api-key-env {name}: {e}"),
        },
    };
    let config = crate::openai::Config {
        base_url: cli.base_url.clone().unwrap_or_default(),
        api_key,
        model: cli.model_name.clone().unwrap_or_default(),
        request_timeout: cli.model_timeout.unwrap_or(Duration::from_secs(60)),
        tries: cli.model_tries.unwrap_or(4),
    };
    Ok(AnyModel::OpenAi(crate::openai::OpenAiModel::new(config)?))
}
