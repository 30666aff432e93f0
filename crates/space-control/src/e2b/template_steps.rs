//! E2B's template build steps (its SDKs' `Template()` builder) as a Dockerfile that space's
//! builder runs: each step one instruction, every value quoted so that the Dockerfile means
//! exactly what the step said (no variable of the build expands in it).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::errors::E2bError;

/// `POST /v2/templates/{id}/builds/{build}`: what to build on.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStart {
    pub from_image: Option<String>,
    pub from_template: Option<String>,
    pub from_image_registry: Option<serde_json::Value>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub steps: Vec<Step>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    pub files_hash: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// The images E2B's SDKs name for their own base (`Template().from_base_image()`): the
/// server's default template stands for them, as it does for the template `base`.
const E2B_BASE_IMAGES: [&str; 2] = ["e2bdev/base", "e2bdev/base:latest"];

/// Where a step's uploaded files are in the build context: under their hash.
pub fn context_dir(hash: &str) -> String {
    format!("e2b-files/{hash}")
}

/// The Dockerfile of `start`, building on `default_template` for E2B's base. Refuses (400)
/// what it cannot say exactly, and (501) what space does not do.
pub fn dockerfile(start: &BuildStart, default_template: &str) -> Result<String, E2bError> {
    if start.from_image_registry.is_some() {
        return Err(E2bError::unsupported(
            "registry credentials for a template's base image",
            "pull the image on the server's host and import it (space template import NAME docker://…), then build from it",
        ));
    }
    if start.start_cmd.as_deref().is_some_and(|c| !c.trim().is_empty()) {
        return Err(E2bError::unsupported(
            "a template's start command",
            "start the process after the create (commands.run(..., background=True))",
        ));
    }
    if start.ready_cmd.as_deref().is_some_and(|c| !c.trim().is_empty()) {
        tracing::info!("an E2B template build's ready command is ignored: there is no start command to wait for");
    }
    let mut lines = vec![format!("FROM {}", from(start, default_template)?)];
    let mut user: Option<String> = None;
    for (n, step) in start.steps.iter().enumerate() {
        let bad = |why: &str| E2bError::bad_request(format!("step {} ({}): {why}", n + 1, step.kind));
        step_lines(step, &mut user, &mut lines).map_err(|why| bad(&why))?;
    }
    Ok(lines.join("\n") + "\n")
}

fn from(start: &BuildStart, default_template: &str) -> Result<String, E2bError> {
    match (start.from_template.as_deref(), start.from_image.as_deref()) {
        (Some(_), Some(_)) => Err(E2bError::bad_request("give fromTemplate or fromImage, not both")),
        (Some("base" | ""), None) | (None, None) => Ok(default_template.to_owned()),
        (Some(template), None) => {
            // A template name, as any name a user gives: no `..` (scoped names), nothing that
            // could end the Dockerfile's line.
            crate::api::templates::check_name(template)?;
            Ok(template.to_owned())
        }
        (None, Some(image)) if E2B_BASE_IMAGES.contains(&image) => Ok(default_template.to_owned()),
        (None, Some(image)) => registry_image(image).map(|r| format!("docker://{r}")),
    }
}

/// Whether `start` builds on an image pulled from a registry (not a template).
pub fn pulls_an_image(start: &BuildStart) -> bool {
    start.from_template.is_none() && start.from_image.as_deref().is_some_and(|i| !E2B_BASE_IMAGES.contains(&i))
}

/// A Docker image name as a registry reference: Docker Hub's short names made whole
/// (`python:3.12` is `docker.io/library/python:3.12`).
fn registry_image(image: &str) -> Result<String, E2bError> {
    if image.is_empty() || image.contains(|c: char| c.is_whitespace() || c.is_control() || "$\\\"'".contains(c)) {
        return Err(E2bError::bad_request(format!("fromImage {image:?} is not an image name")));
    }
    let first = image.split('/').next().unwrap_or_default();
    let has_host = image.contains('/') && (first.contains(['.', ':']) || first == "localhost");
    Ok(match (has_host, image.contains('/')) {
        (true, _) => image.to_owned(),
        (false, true) => format!("docker.io/{image}"),
        (false, false) => format!("docker.io/library/{image}"),
    })
}

/// The instructions of one step (a `RUN` as another user is wrapped in two `USER`s).
fn step_lines(step: &Step, user: &mut Option<String>, lines: &mut Vec<String>) -> Result<(), String> {
    let args = &step.args;
    match step.kind.as_str() {
        "RUN" => {
            let command = args.first().ok_or("a RUN step needs its command")?;
            let exec = serde_json::to_string(&["/bin/sh", "-c", command]).map_err(|e| e.to_string())?;
            match args.get(1).filter(|u| !u.is_empty()) {
                Some(as_user) => {
                    lines.push(format!("USER {}", checked_user(as_user)?));
                    lines.push(format!("RUN {exec}"));
                    lines.push(format!("USER {}", user.as_deref().unwrap_or("root")));
                }
                None => lines.push(format!("RUN {exec}")),
            }
        }
        "COPY" => lines.push(copy(step)?),
        "ENV" => {
            if args.is_empty() || !args.len().is_multiple_of(2) {
                return Err("an ENV step needs names and values in pairs".into());
            }
            let pairs: Vec<String> = args
                .chunks(2)
                .map(|pair| Ok(format!("{}={}", checked_name(&pair[0])?, single_quoted(&pair[1])?)))
                .collect::<Result<_, String>>()?;
            lines.push(format!("ENV {}", pairs.join(" ")));
        }
        "WORKDIR" => lines.push(format!("WORKDIR {}", plain(args.first().ok_or("a WORKDIR step needs its path")?)?)),
        "USER" => {
            let name = checked_user(args.first().ok_or("a USER step needs its user")?)?;
            lines.push(format!("USER {name}"));
            *user = Some(name.to_owned());
        }
        other => return Err(format!("{other:?} is not a step space builds (RUN, COPY, ENV, WORKDIR, USER)")),
    }
    Ok(())
}

/// `COPY [--chown=USER] [--chmod=MODE] ["e2b-files/HASH/SRC", "DEST"]`.
fn copy(step: &Step) -> Result<String, String> {
    let hash = step.files_hash.as_deref().ok_or("a COPY step needs its filesHash")?;
    check_hash(hash)?;
    let [src, dest, rest @ ..] = step.args.as_slice() else {
        return Err("a COPY step needs a source and a destination".into());
    };
    let mut line = String::from("COPY");
    if let Some(owner) = rest.first().filter(|u| !u.is_empty()) {
        line += &format!(" --chown={}", checked_user(owner)?);
    }
    if let Some(mode) = rest.get(1).filter(|m| !m.is_empty()) {
        if !mode.bytes().all(|b| (b'0'..=b'7').contains(&b)) || mode.len() > 5 {
            return Err(format!("mode {mode:?} is not octal"));
        }
        line += &format!(" --chmod={mode}");
    }
    let src = format!("{}/{}", context_dir(hash), plain(src.trim_start_matches("./"))?);
    let words = serde_json::to_string(&[src.as_str(), plain(dest)?]).map_err(|e| e.to_string())?;
    Ok(format!("{line} {words}"))
}

/// A file hash as E2B's SDKs make them (hex; a path component, so nothing else).
pub fn check_hash(hash: &str) -> Result<(), String> {
    if hash.is_empty() || hash.len() > 128 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("files hash {hash:?} is not hex"));
    }
    Ok(())
}

fn checked_name(name: &str) -> Result<&str, String> {
    let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then_some(name).ok_or_else(|| format!("{name:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"))
}

fn checked_user(user: &str) -> Result<&str, String> {
    let valid =
        !user.is_empty() && user.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    valid.then_some(user).ok_or_else(|| format!("{user:?} is not a user name"))
}

/// A path as written: nothing the builder would expand or unquote, and on one line.
fn plain(path: &str) -> Result<&str, String> {
    if path.is_empty() || path.contains(|c: char| c.is_control() || "$\\\"'".contains(c)) {
        return Err(format!("{path:?} must be a path without $, quotes, backslashes or line breaks"));
    }
    Ok(path)
}

/// `value` in single quotes (where nothing expands), a `'` written as `'"'"'`.
fn single_quoted(value: &str) -> Result<String, String> {
    if value.contains(['\n', '\r']) {
        return Err("an ENV value cannot hold a line break".into());
    }
    Ok(format!("'{}'", value.replace('\'', r#"'"'"'"#)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: &str, args: &[&str]) -> Step {
        Step { kind: kind.into(), args: args.iter().map(|a| a.to_string()).collect(), ..Step::default() }
    }

    fn build(steps: Vec<Step>) -> BuildStart {
        BuildStart { from_template: Some("debian".into()), steps, ..BuildStart::default() }
    }

    /// What the SDK's builder sends becomes a Dockerfile that space's parser reads back to the
    /// same values: quotes, `$` and spaces are the step's, not the build's.
    #[test]
    fn steps_become_a_dockerfile_that_means_what_they_said() {
        let hash = "ab".repeat(32);
        let mut copy = step("COPY", &["./app", "/srv/", "user", "0755"]);
        copy.files_hash = Some(hash.clone());
        let start = build(vec![
            step("ENV", &["GREETING", "it's $HOME \"quoted\"", "B", ""]),
            step("RUN", &["echo $GREETING > /tmp/g && ls"]),
            step("USER", &["user"]),
            step("RUN", &["apt-get update", "root"]),
            step("WORKDIR", &["/srv"]),
            copy,
        ]);
        let text = dockerfile(&start, "busybox").unwrap();
        let parsed = space_dockerfile::parse(&text).unwrap();
        let kinds: Vec<_> = parsed.instructions.iter().map(|i| i.kind.clone()).collect();
        use space_dockerfile::Kind;
        assert_eq!(kinds[0], Kind::From { image: "debian".into() });
        let Kind::Env { vars } = &kinds[1] else { panic!("{text}") };
        // `\$` is the parser's mark of a `$` that does not expand.
        assert_eq!(vars[0], ("GREETING".into(), r#"it's \$HOME "quoted""#.into()));
        assert_eq!(vars[1], ("B".into(), String::new()));
        assert!(text.contains(r#"RUN ["/bin/sh","-c","echo $GREETING > /tmp/g && ls"]"#), "{text}");
        assert!(text.contains("USER root\nRUN [\"/bin/sh\",\"-c\",\"apt-get update\"]\nUSER user\n"), "{text}");
        assert!(
            text.contains(&format!(r#"COPY --chown=user --chmod=0755 ["e2b-files/{hash}/app","/srv/"]"#)),
            "{text}"
        );
    }

    #[test]
    fn bases_map_onto_templates_and_registries() {
        let from = |template: Option<&str>, image: Option<&str>| {
            let start = BuildStart {
                from_template: template.map(Into::into),
                from_image: image.map(Into::into),
                ..BuildStart::default()
            };
            dockerfile(&start, "debian").map(|d| d.lines().next().unwrap_or_default().to_owned())
        };
        assert_eq!(from(Some("base"), None).unwrap(), "FROM debian");
        assert_eq!(from(None, Some("e2bdev/base")).unwrap(), "FROM debian");
        assert_eq!(from(Some("mine"), None).unwrap(), "FROM mine");
        assert_eq!(from(None, Some("python:3.12")).unwrap(), "FROM docker://docker.io/library/python:3.12");
        assert_eq!(from(None, Some("org/app:1")).unwrap(), "FROM docker://docker.io/org/app:1");
        assert_eq!(from(None, Some("127.0.0.1:5000/app:1")).unwrap(), "FROM docker://127.0.0.1:5000/app:1");
        assert_eq!(from(Some("a"), Some("b")).unwrap_err().code, 400);
    }

    #[test]
    fn what_cannot_be_said_exactly_is_refused() {
        let refused = |step: Step| dockerfile(&build(vec![step]), "debian").unwrap_err();
        assert_eq!(refused(step("HEALTHCHECK", &["x"])).code, 400);
        assert!(refused(step("ENV", &["A", "line\nbreak"])).message.contains("line break"));
        assert!(refused(step("ENV", &["1A", "v"])).message.contains("variable name"));
        assert!(refused(step("WORKDIR", &["/$HOME"])).message.contains("without $"));
        assert!(refused(step("COPY", &["a", "/b"])).message.contains("filesHash"));
        let mut bad_hash = step("COPY", &["a", "/b"]);
        bad_hash.files_hash = Some("../x".into());
        assert!(refused(bad_hash).message.contains("not hex"));
        let start = BuildStart { start_cmd: Some("server".into()), ..BuildStart::default() };
        assert_eq!(dockerfile(&start, "debian").unwrap_err().code, 501);
    }
}
