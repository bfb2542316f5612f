//! `--header-timeout`, `--body-timeout`, `--max-connections-per-client`: how long and how
//! much a client may hold a server's connections, shared by `cube manager`, `cube worker`
//! and `cube dev`.

use std::time::Duration;

use clap::Args;
use cube_api::ServeLimits;
use cube_api::serve::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
};
use cube_types::duration::parse_duration;

#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// How long a client may take to send a request's headers; also how long a kept-alive
    /// connection may stay idle between requests (e.g. 30s). A slower client is cut off.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// How long a client may take to send a request's body, once its headers arrived (e.g.
    /// 60s); a slower one is answered 408. Answers (events, followed logs) are not limited.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    body_timeout: Duration,
    /// How many connections one client address may hold open at once; more are closed as
    /// they are accepted.
    #[arg(long, default_value_t = 128, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_client: u32,
}

impl Default for LimitArgs {
    fn default() -> LimitArgs {
        LimitArgs {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT as u32,
        }
    }
}

impl LimitArgs {
    /// The limits, checked: a timeout of zero would cut every client off.
    pub fn limits(&self) -> anyhow::Result<ServeLimits> {
        anyhow::ensure!(
            !self.header_timeout.is_zero(),
            "--header-timeout must be longer than 0"
        );
        anyhow::ensure!(
            !self.body_timeout.is_zero(),
            "--body-timeout must be longer than 0"
        );
        Ok(ServeLimits {
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
            max_connections_per_client: self.max_connections_per_client as usize,
        })
    }
}
