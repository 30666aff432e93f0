//! COPY and ADD: `--chown`/`--chmod`, then sources and a destination in shell or JSON form.

use crate::Kind;
use crate::error::ParseError;
use crate::parse::{Context, Flag, json_array, refuse_heredoc, take_flags};

/// What the flags set, each at most once.
#[derive(Default)]
struct CopyFlags {
    chown: Option<String>,
    chmod: Option<String>,
}

pub(crate) fn copy(context: Context<'_>, rest: &str, add: bool) -> Result<Kind, ParseError> {
    let (flags, rest) = take_flags(rest);
    let CopyFlags { chown, chmod } = copy_flags(context, &flags)?;
    let mut words = match json_array(rest) {
        Some(words) => words,
        None => {
            refuse_heredoc(context, rest)?;
            rest.split_whitespace().map(str::to_string).collect()
        }
    };
    let dest = match words.pop() {
        Some(dest) if !words.is_empty() => dest,
        _ => return Err(context.error(format!("{} needs at least one source and a destination", context.keyword))),
    };
    for source in &words {
        refuse_url(context, source, add)?;
    }
    Ok(Kind::Copy { sources: words, dest, chown, chmod, add })
}

fn copy_flags(context: Context<'_>, flags: &[Flag<'_>]) -> Result<CopyFlags, ParseError> {
    let keyword = context.keyword;
    let mut parsed = CopyFlags::default();
    for flag in flags {
        let slot = match flag.name {
            "chown" => &mut parsed.chown,
            "chmod" => &mut parsed.chmod,
            "from" if keyword == "COPY" => return Err(context.error("COPY --from (multi-stage) is not supported")),
            name => return Err(context.error(format!("{keyword} --{name} is not supported"))),
        };
        let value = match flag.value {
            Some(value) if !value.is_empty() => value,
            _ => return Err(context.error(format!("{keyword} --{} needs a value", flag.name))),
        };
        if slot.is_some() {
            return Err(context.error(format!("{keyword} --{} is given twice", flag.name)));
        }
        *slot = Some(value.to_string());
    }
    if let Some(chown) = &parsed.chown {
        check_chown(context, chown)?;
    }
    if let Some(chmod) = &parsed.chmod {
        check_chmod(context, chmod)?;
    }
    Ok(parsed)
}

/// `USER[:GROUP]`, neither part empty; names are resolved against the image by the builder.
fn check_chown(context: Context<'_>, chown: &str) -> Result<(), ParseError> {
    let (user, group) = chown.split_once(':').unwrap_or((chown, "x"));
    if user.is_empty() || group.is_empty() || group.contains(':') {
        return Err(context.error(format!("{} --chown={chown} is not USER[:GROUP]", context.keyword)));
    }
    Ok(())
}

/// Octal permission bits, at most 7777; symbolic modes are not in the subset.
fn check_chmod(context: Context<'_>, chmod: &str) -> Result<(), ParseError> {
    let octal = chmod.bytes().all(|b| (b'0'..=b'7').contains(&b));
    match u32::from_str_radix(chmod, 8) {
        Ok(mode) if octal && mode <= 0o7777 => Ok(()),
        _ => Err(context.error(format!("{} --chmod={chmod} is not an octal mode of at most 7777", context.keyword))),
    }
}

/// ADD can fetch URLs in Docker; here the build has no network of its own at that point, so
/// the user is told to download in a RUN step. COPY never takes URLs, as in Docker.
fn refuse_url(context: Context<'_>, source: &str, add: bool) -> Result<(), ParseError> {
    let lower = source.to_ascii_lowercase();
    let web = lower.starts_with("http://") || lower.starts_with("https://");
    if add && (web || lower.starts_with("git@")) {
        return Err(context.error("ADD from a URL is not supported: download it in a RUN step"));
    }
    if web {
        return Err(context.error(format!("COPY source {source:?} is a URL; COPY takes files from the context")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(content: &str) -> Result<Kind, ParseError> {
        let (keyword, rest) = content.split_once(' ').unwrap_or((content, ""));
        copy(Context { line: 4, keyword }, rest.trim(), keyword == "ADD")
    }

    fn refused(content: &str, phrase: &str) {
        let error = parse(content).unwrap_err();
        assert_eq!(error.line, 4, "{error}");
        assert!(error.message.contains(phrase), "{content:?}: {error}");
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn shell_form_with_flags() {
        assert_eq!(
            parse("COPY --chown=app:staff --chmod=0755 a  b/ /dst/").unwrap(),
            Kind::Copy {
                sources: strings(&["a", "b/"]),
                dest: "/dst/".to_string(),
                chown: Some("app:staff".to_string()),
                chmod: Some("0755".to_string()),
                add: false,
            }
        );
    }

    #[test]
    fn json_form_and_add() {
        assert_eq!(
            parse("ADD [\"my file\", \"/opt/dir/\"]").unwrap(),
            Kind::Copy {
                sources: strings(&["my file"]),
                dest: "/opt/dir/".to_string(),
                chown: None,
                chmod: None,
                add: true,
            }
        );
    }

    #[test]
    fn malformed_json_is_split_on_whitespace() {
        assert_eq!(
            parse("COPY [a] /x").unwrap(),
            Kind::Copy { sources: strings(&["[a]"]), dest: "/x".to_string(), chown: None, chmod: None, add: false }
        );
    }

    #[test]
    fn needs_a_source_and_a_destination() {
        refused("COPY", "COPY needs at least one source and a destination");
        refused("COPY onlyone", "COPY needs at least one source and a destination");
        refused("ADD [\"/dst\"]", "ADD needs at least one source and a destination");
        refused("COPY --chown=a", "COPY needs at least one source");
    }

    #[test]
    fn refuses_unsupported_flags_by_name() {
        refused("COPY --from=build /a /b", "COPY --from (multi-stage) is not supported");
        refused("COPY --link a b", "COPY --link is not supported");
        refused("COPY --parents a b", "COPY --parents is not supported");
        refused("COPY --exclude=*.md a b", "COPY --exclude is not supported");
        refused("ADD --checksum=sha256:00 a b", "ADD --checksum is not supported");
        refused("ADD --from=x a b", "ADD --from is not supported");
    }

    #[test]
    fn validates_chown_and_chmod() {
        refused("COPY --chown a b", "COPY --chown needs a value");
        refused("COPY --chown= a b", "COPY --chown needs a value");
        refused("COPY --chown=:g a b", "is not USER[:GROUP]");
        refused("COPY --chown=u: a b", "is not USER[:GROUP]");
        refused("COPY --chmod=755 --chmod=644 a b", "--chmod is given twice");
        refused("COPY --chmod=u+x a b", "--chmod=u+x is not an octal mode");
        refused("COPY --chmod=0789 a b", "is not an octal mode");
        refused("COPY --chmod=17777 a b", "is not an octal mode of at most 7777");
        refused("COPY --chmod=+755 a b", "is not an octal mode");
        assert!(parse("COPY --chmod=7777 a b").is_ok());
        assert!(parse("COPY --chown=1000 a b").is_ok());
    }

    #[test]
    fn refuses_urls() {
        for source in ["http://example.com/x.tgz", "HTTPS://example.com/x", "git@github.com:a/b.git"] {
            refused(&format!("ADD {source} /x"), "ADD from a URL is not supported: download it in a RUN step");
        }
        refused("COPY https://example.com/x /x", "is a URL");
        assert!(parse("COPY git@file /x").is_ok());
    }

    #[test]
    fn refuses_heredocs() {
        refused("COPY <<EOF /etc/conf", "heredocs (<<EOF) are not supported");
    }
}
