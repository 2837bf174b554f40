//! The gateway client as the command line uses it: `leasehold_client`'s gateway, at `--server`, with the token of
//! `--gateway-token`, `--token-file` or `$LEASEHOLD_TOKEN`.

pub(crate) use leasehold_client::gateway::*;
pub(crate) use leasehold_client::{Error, OutcomeUnknown};

/// The bearer token of the command line: `--gateway-token`, else the first line of `--token-file`, else
/// `$LEASEHOLD_TOKEN` (unless empty), else none.
pub(crate) fn token(global: &crate::GlobalArgs) -> anyhow::Result<Option<String>> {
    Ok(bearer_token(global.gateway_token.as_deref(), global.token_file.as_deref())?)
}

/// The gateway of `--server`, with the token of [`token`].
pub(crate) fn gateway(global: &crate::GlobalArgs) -> anyhow::Result<Gateway> {
    Ok(Gateway::with_token(&global.server, token(global)?.as_deref())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_the_flag_else_the_file_else_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-the-file-0123456789\n# ignored\n").unwrap();
        let parse = |argv: &[&str]| {
            use clap::Parser as _;
            let cli = crate::Cli::try_parse_from(["leasehold"].iter().chain(argv).copied()).unwrap();
            token(&cli.global).unwrap()
        };
        let path = file.display().to_string();
        assert_eq!(
            parse(&["--gateway-token", "from-the-flag-0123456789", "agents"]).as_deref(),
            Some("from-the-flag-0123456789")
        );
        assert_eq!(parse(&["agents", "--token-file", &path]).as_deref(), Some("from-the-file-0123456789"));
        use clap::Parser as _;
        assert!(
            crate::Cli::try_parse_from(["leasehold", "--gateway-token", "x", "--token-file", &path, "agents"]).is_err()
        );
        std::fs::write(&file, "\n").unwrap();
        let cli = crate::Cli::try_parse_from(["leasehold", "--token-file", &path, "agents"]).unwrap();
        assert!(token(&cli.global).unwrap_err().to_string().contains("first line is empty"));
    }
}
