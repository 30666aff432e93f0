//! Dockerfile parsing for `space template build`.
//!
//! Templates are built from the single-stage subset of Dockerfile syntax that covers most real
//! files: FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, CMD and ENTRYPOINT. Anything else is
//! refused up front with the line it is on, rather than half-honoured during a long build.
//! Parsing follows Docker's rules (case-insensitive keywords, `\` continuations, comments,
//! the JSON exec form) so a file that builds with Docker means the same thing here.
//!
//! The parser does not expand variables: the builder calls [`substitute`] on each word with
//! the ARG and ENV values in scope at that instruction, as Docker does for FROM, COPY/ADD,
//! ENV, ARG, WORKDIR and USER (not RUN, CMD or ENTRYPOINT, which the shell expands).

mod copy;
mod env;
mod error;
mod lines;
mod parse;
mod substitute;
mod words;

pub use error::{ParseError, SubstituteError};
pub use substitute::{MAX_EXPANDED, substitute};

/// Largest Dockerfile accepted; a real one is a few KiB, so this only stops runaway input.
const MAX_FILE: usize = 1024 * 1024;

/// A parsed Dockerfile: its instructions in file order, starting with ARGs (if any) and FROM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    pub instructions: Vec<Instruction>,
}

/// One instruction. `ARG A B` becomes two instructions with the same line and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// 1-based line where the instruction starts.
    pub line: usize,
    /// The instruction as written, continuation lines joined with a single space, for logs and
    /// cache keys. Whitespace is normalised here while `kind` keeps Docker's joining (`a\` then
    /// `b` is `ab`), so a cache key should include `kind` as well as `text`.
    pub text: String,
    pub kind: Kind,
}

/// What an instruction does. Words are as written (variables not yet substituted), except
/// that ENV values and ARG defaults have had their quotes and backslash escapes removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `FROM image`; one stage only.
    From {
        image: String,
    },
    Run {
        command: Command,
    },
    /// COPY, or ADD when `add` is set. In the JSON form the last element is `dest`; in the
    /// shell form the arguments are split on whitespace. `chmod` is validated octal (≤ 7777);
    /// `chown` is `USER[:GROUP]`. Sources are kept as written (a leading `/` means the root of
    /// the build context, as in Docker).
    Copy {
        sources: Vec<String>,
        dest: String,
        chown: Option<String>,
        chmod: Option<String>,
        add: bool,
    },
    /// Values are unquoted. A `$` that Docker keeps literal (written `\$`, or inside single
    /// quotes) is kept as `\$` so that [`substitute`] leaves it alone: pass every value through
    /// [`substitute`] before use.
    Env {
        vars: Vec<(String, String)>,
    },
    Workdir {
        path: String,
    },
    User {
        user: String,
    },
    /// The default, if any, is unquoted like an ENV value and likewise goes through [`substitute`].
    Arg {
        name: String,
        default: Option<String>,
    },
    Cmd {
        command: Command,
    },
    Entrypoint {
        command: Command,
    },
}

/// RUN, CMD and ENTRYPOINT arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// The shell form, to run with `/bin/sh -c`; continuation lines joined as Docker joins them.
    Shell(String),
    /// The JSON exec form, run without a shell.
    Exec(Vec<String>),
}

/// Parses a Dockerfile, refusing anything outside the supported subset with the line it is on.
pub fn parse(text: &str) -> Result<Dockerfile, ParseError> {
    if text.len() > MAX_FILE {
        return Err(ParseError::new(1, "the Dockerfile is larger than 1 MiB"));
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut instructions = Vec::new();
    let mut stage = Stage::default();
    for logical in lines::LogicalLines::new(text) {
        let logical = logical?;
        for kind in parse::parse_line(&logical)? {
            stage.check(logical.line, &kind)?;
            instructions.push(Instruction { line: logical.line, text: logical.text.clone(), kind });
        }
    }
    if !stage.from_seen {
        return Err(ParseError::new(1, "the Dockerfile has no FROM"));
    }
    Ok(Dockerfile { instructions })
}

/// Enforces the single-stage shape: only ARG before the one FROM.
#[derive(Default)]
struct Stage {
    from_seen: bool,
}

impl Stage {
    fn check(&mut self, line: usize, kind: &Kind) -> Result<(), ParseError> {
        match kind {
            Kind::From { .. } if self.from_seen => {
                Err(ParseError::new(line, "multi-stage builds are not supported: one FROM per Dockerfile"))
            }
            Kind::From { .. } => {
                self.from_seen = true;
                Ok(())
            }
            Kind::Arg { .. } => Ok(()),
            _ if !self.from_seen => {
                Err(ParseError::new(line, format!("{} before FROM: only ARG may come before FROM", keyword(kind))))
            }
            _ => Ok(()),
        }
    }
}

fn keyword(kind: &Kind) -> &'static str {
    match kind {
        Kind::From { .. } => "FROM",
        Kind::Run { .. } => "RUN",
        Kind::Copy { add: false, .. } => "COPY",
        Kind::Copy { add: true, .. } => "ADD",
        Kind::Env { .. } => "ENV",
        Kind::Workdir { .. } => "WORKDIR",
        Kind::User { .. } => "USER",
        Kind::Arg { .. } => "ARG",
        Kind::Cmd { .. } => "CMD",
        Kind::Entrypoint { .. } => "ENTRYPOINT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REALISTIC: &str = r#"# syntax=docker/dockerfile:1
ARG BASE=ubuntu:24.04
FROM ${BASE}

RUN apt-get update && \
    # the tools the template needs
    apt-get install -y curl
run ["/bin/sh", "-c", "echo hi"]
COPY --chown=app:app src/ /app/src/
ADD vendor.tar.gz /opt/
ENV PATH=/app/bin:$PATH GREETING="hello world" NAME='single' SPACED=a\ b
ENV LEGACY "value with" spaces
WORKDIR /app
USER app
CMD ["./server", "--port", "8080"]
ENTRYPOINT /entry.sh --verbose
"#;

    fn instruction(line: usize, text: &str, kind: Kind) -> Instruction {
        Instruction { line, text: text.to_string(), kind }
    }

    fn s(text: &str) -> String {
        text.to_string()
    }

    fn refused(text: &str, line: usize, phrase: &str) {
        let error = parse(text).unwrap_err();
        assert_eq!(error.line, line, "{error}");
        assert!(error.message.contains(phrase), "{error}");
        assert!(error.to_string().starts_with(&format!("line {line}: ")), "{error}");
    }

    #[test]
    fn parses_a_realistic_file() {
        let expected = vec![
            instruction(2, "ARG BASE=ubuntu:24.04", Kind::Arg { name: s("BASE"), default: Some(s("ubuntu:24.04")) }),
            instruction(3, "FROM ${BASE}", Kind::From { image: s("${BASE}") }),
            instruction(
                5,
                "RUN apt-get update && apt-get install -y curl",
                Kind::Run { command: Command::Shell(s("apt-get update &&     apt-get install -y curl")) },
            ),
            instruction(
                8,
                r#"run ["/bin/sh", "-c", "echo hi"]"#,
                Kind::Run { command: Command::Exec(vec![s("/bin/sh"), s("-c"), s("echo hi")]) },
            ),
            instruction(
                9,
                "COPY --chown=app:app src/ /app/src/",
                Kind::Copy {
                    sources: vec![s("src/")],
                    dest: s("/app/src/"),
                    chown: Some(s("app:app")),
                    chmod: None,
                    add: false,
                },
            ),
            instruction(
                10,
                "ADD vendor.tar.gz /opt/",
                Kind::Copy { sources: vec![s("vendor.tar.gz")], dest: s("/opt/"), chown: None, chmod: None, add: true },
            ),
            instruction(
                11,
                r#"ENV PATH=/app/bin:$PATH GREETING="hello world" NAME='single' SPACED=a\ b"#,
                Kind::Env {
                    vars: vec![
                        (s("PATH"), s("/app/bin:$PATH")),
                        (s("GREETING"), s("hello world")),
                        (s("NAME"), s("single")),
                        (s("SPACED"), s("a b")),
                    ],
                },
            ),
            instruction(
                12,
                r#"ENV LEGACY "value with" spaces"#,
                Kind::Env { vars: vec![(s("LEGACY"), s("value with spaces"))] },
            ),
            instruction(13, "WORKDIR /app", Kind::Workdir { path: s("/app") }),
            instruction(14, "USER app", Kind::User { user: s("app") }),
            instruction(
                15,
                r#"CMD ["./server", "--port", "8080"]"#,
                Kind::Cmd { command: Command::Exec(vec![s("./server"), s("--port"), s("8080")]) },
            ),
            instruction(
                16,
                "ENTRYPOINT /entry.sh --verbose",
                Kind::Entrypoint { command: Command::Shell(s("/entry.sh --verbose")) },
            ),
        ];
        assert_eq!(parse(REALISTIC).unwrap(), Dockerfile { instructions: expected });
    }

    #[test]
    fn several_args_on_one_line_share_it() {
        let parsed = parse("ARG A B=2\nFROM x").unwrap();
        assert_eq!(
            parsed.instructions,
            vec![
                instruction(1, "ARG A B=2", Kind::Arg { name: s("A"), default: None }),
                instruction(1, "ARG A B=2", Kind::Arg { name: s("B"), default: Some(s("2")) }),
                instruction(2, "FROM x", Kind::From { image: s("x") }),
            ]
        );
    }

    #[test]
    fn strips_a_byte_order_mark_and_crlf() {
        let parsed = parse("\u{feff}FROM x\r\nRUN a \\\r\n  b\r\n").unwrap();
        assert_eq!(
            parsed.instructions,
            vec![
                instruction(1, "FROM x", Kind::From { image: s("x") }),
                instruction(2, "RUN a b", Kind::Run { command: Command::Shell(s("a   b")) }),
            ]
        );
    }

    #[test]
    fn refuses_a_second_from() {
        refused("FROM a\nRUN x\n\nFROM b\n", 4, "multi-stage builds are not supported: one FROM per Dockerfile");
    }

    #[test]
    fn refuses_instructions_before_from() {
        refused("ARG A\n# c\nRUN x\nFROM a\n", 3, "RUN before FROM");
        refused("ENV A=1\nFROM a\n", 1, "ENV before FROM");
        refused("ADD a b\nFROM a\n", 1, "ADD before FROM");
    }

    #[test]
    fn refuses_a_file_without_from() {
        refused("", 1, "the Dockerfile has no FROM");
        refused("# only a comment\n\nARG A\n", 1, "the Dockerfile has no FROM");
    }

    #[test]
    fn refuses_multi_stage_and_platform() {
        refused("FROM golang AS build\n", 1, "multi-stage builds (FROM … AS) are not supported");
        refused("ARG X\nFROM --platform=$BUILDPLATFORM alpine\n", 2, "FROM --platform is not supported");
        refused("FROM a\nCOPY --from=build /out /out\n", 2, "COPY --from (multi-stage) is not supported");
    }

    #[test]
    fn refuses_other_escape_characters() {
        refused("# escape=`\nFROM a\n", 1, "only the default escape character \\ is supported");
    }

    #[test]
    fn refuses_heredocs_at_their_line() {
        refused("FROM a\nRUN <<EOF\necho hi\nEOF\n", 2, "heredocs (<<EOF) are not supported");
        refused("FROM a\n\nCOPY <<EOF /x\nhi\nEOF\n", 3, "heredocs (<<EOF) are not supported");
    }

    #[test]
    fn refusals_name_the_line_of_a_continued_instruction() {
        refused("FROM a\nRUN \\\n  --mount=type=cache,target=/x \\\n  make\n", 2, "RUN --mount is not supported");
        refused("FROM a\nEXPOSE \\\n 80\n", 2, "EXPOSE is not supported by space template build (supported: FROM,");
        refused("FROM a\nCOPY only\n", 2, "COPY needs at least one source and a destination");
        refused(
            "FROM a\nADD https://x.org/a.tgz /a\n",
            2,
            "ADD from a URL is not supported: download it in a RUN step",
        );
        refused("FROM a\nENV 1A=x\n", 2, "is not a valid variable name");
        refused("FROM a\nWORKDIR\n", 2, "WORKDIR needs a path");
        refused("FROM a\nCMD\n", 2, "CMD needs a command");
    }

    #[test]
    fn the_first_error_in_file_order_wins() {
        refused("FROM a\nLABEL x=y\nRUN --mount=x y\n", 2, "LABEL is not supported");
    }

    #[test]
    fn refuses_oversized_input() {
        let big = format!("FROM a\n{}", "# padding\n".repeat(110_000));
        refused(&big, 1, "the Dockerfile is larger than 1 MiB");
        let long = format!("FROM a\nRUN echo {}\n", "x".repeat(300 * 1024));
        refused(&long, 2, "the instruction is longer than 256 KiB");
    }
}
