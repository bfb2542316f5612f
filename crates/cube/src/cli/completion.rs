//! `cube completion SHELL`: the shell's completion script for `cube`, on stdout.

use std::io::Write;

use anyhow::Context;
use clap::Args;
use clap_complete::Shell;

/// Print a completion script for bash, zsh, fish, elvish or PowerShell.
///
/// The script completes commands, flags and the values a flag takes (schedulers, store
/// types, restart policies). Load it once in the shell, or install it where the shell looks.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    source <(cube completion bash)                          # this bash session\n  \
    cube completion bash > /etc/bash_completion.d/cube      # every bash session\n  \
    cube completion zsh > \"${fpath[1]}/_cube\"               # zsh (then: compinit)\n  \
    cube completion fish > ~/.config/fish/completions/cube.fish")]
pub struct CompletionArgs {
    /// The shell to write the script for.
    #[arg(value_enum, value_name = "SHELL")]
    shell: Shell,
}

/// Writes the script for `command` (the whole `cube` command line) to stdout.
pub fn completion(args: CompletionArgs, mut command: clap::Command) -> anyhow::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "cube", &mut script);
    // One write of the whole script: a reader that closes early sees a broken pipe once,
    // and the top level treats that as the normal end it is.
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .context("writing the completion script")
}
