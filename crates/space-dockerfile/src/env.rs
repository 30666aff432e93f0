//! ENV and ARG: `NAME=value` pairs (quotes removed), and ENV's legacy `NAME value` form.

use crate::Kind;
use crate::error::ParseError;
use crate::parse::{Context, refuse_flags, take_flags};
use crate::words::{Unterminated, is_valid_name, split_words, unquote};

pub(crate) fn env(context: Context<'_>, rest: &str) -> Result<Kind, ParseError> {
    let (flags, rest) = take_flags(rest);
    refuse_flags(context, &flags)?;
    let words = split_words(rest);
    let Some(first) = words.first() else {
        return Err(context.error("ENV needs NAME=value"));
    };
    if !first.contains('=') {
        return Ok(Kind::Env { vars: vec![legacy_pair(context, rest)?] });
    }
    let vars = words
        .iter()
        .map(|word| match word.split_once('=') {
            Some((name, value)) => Ok((checked_name(context, name)?, unquoted(context, value)?)),
            None => Err(context.error(format!("ENV {word:?} is not NAME=value"))),
        })
        .collect::<Result<_, _>>()?;
    Ok(Kind::Env { vars })
}

/// `ENV NAME value with spaces`: one pair, the value is the rest of the line.
fn legacy_pair(context: Context<'_>, rest: &str) -> Result<(String, String), ParseError> {
    let Some((name, value)) = rest.split_once(char::is_whitespace) else {
        return Err(context.error(format!("ENV {rest} needs a value: ENV NAME=value or ENV NAME value")));
    };
    Ok((checked_name(context, name)?, unquoted(context, value.trim_start())?))
}

/// `ARG NAME` or `ARG NAME=default`, several per line; one kind each, in order.
pub(crate) fn arg(context: Context<'_>, rest: &str) -> Result<Vec<Kind>, ParseError> {
    let (flags, rest) = take_flags(rest);
    refuse_flags(context, &flags)?;
    let words = split_words(rest);
    if words.is_empty() {
        return Err(context.error("ARG needs a name"));
    }
    words
        .iter()
        .map(|word| {
            let (name, default) = match word.split_once('=') {
                Some((name, value)) => (name, Some(unquoted(context, value)?)),
                None => (word.as_str(), None),
            };
            Ok(Kind::Arg { name: checked_name(context, name)?, default })
        })
        .collect()
}

fn checked_name(context: Context<'_>, name: &str) -> Result<String, ParseError> {
    if !is_valid_name(name) {
        return Err(context.error(format!(
            "{} name {name:?} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)",
            context.keyword
        )));
    }
    Ok(name.to_string())
}

fn unquoted(context: Context<'_>, value: &str) -> Result<String, ParseError> {
    unquote(value).map_err(|Unterminated(quote)| {
        context.error(format!("{} value {value} has an unterminated {quote} quote", context.keyword))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENV: Context<'static> = Context { line: 9, keyword: "ENV" };
    const ARG: Context<'static> = Context { line: 9, keyword: "ARG" };

    fn vars(rest: &str) -> Vec<(String, String)> {
        match env(ENV, rest).unwrap() {
            Kind::Env { vars } => vars,
            other => panic!("not ENV: {other:?}"),
        }
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn arg_kind(name: &str, default: Option<&str>) -> Kind {
        Kind::Arg { name: name.to_string(), default: default.map(str::to_string) }
    }

    fn refused(result: Result<impl std::fmt::Debug, ParseError>, phrase: &str) {
        let error = result.unwrap_err();
        assert_eq!(error.line, 9, "{error}");
        assert!(error.message.contains(phrase), "{error}");
    }

    #[test]
    fn env_pairs() {
        assert_eq!(
            vars("K=V K2=\"v 2\" K3=a\\ b K4='x y' EMPTY= P=$PATH:/bin"),
            pairs(&[("K", "V"), ("K2", "v 2"), ("K3", "a b"), ("K4", "x y"), ("EMPTY", ""), ("P", "$PATH:/bin")])
        );
        assert_eq!(vars("A=b=c"), pairs(&[("A", "b=c")]));
    }

    #[test]
    fn env_legacy_form() {
        assert_eq!(vars("K V with  spaces"), pairs(&[("K", "V with  spaces")]));
        assert_eq!(vars("K   \"quoted value\""), pairs(&[("K", "quoted value")]));
        assert_eq!(vars("K a=b"), pairs(&[("K", "a=b")]));
    }

    #[test]
    fn env_refusals() {
        refused(env(ENV, ""), "ENV needs NAME=value");
        refused(env(ENV, "K"), "needs a value");
        refused(env(ENV, "A=1 B"), "ENV \"B\" is not NAME=value");
        refused(env(ENV, "1A=x"), "ENV name \"1A\" is not a valid variable name");
        refused(env(ENV, "A-B=x"), "is not a valid variable name");
        refused(env(ENV, "=x"), "is not a valid variable name");
        refused(env(ENV, "A-B x"), "is not a valid variable name");
        refused(env(ENV, "A=\"open"), "unterminated \" quote");
    }

    #[test]
    fn arg_names_and_defaults() {
        assert_eq!(arg(ARG, "VERSION").unwrap(), vec![arg_kind("VERSION", None)]);
        assert_eq!(
            arg(ARG, "A=1 B C=\"x y\" D=").unwrap(),
            vec![arg_kind("A", Some("1")), arg_kind("B", None), arg_kind("C", Some("x y")), arg_kind("D", Some(""))]
        );
    }

    #[test]
    fn arg_refusals() {
        refused(arg(ARG, ""), "ARG needs a name");
        refused(arg(ARG, "9=x"), "ARG name \"9\" is not a valid variable name");
        refused(arg(ARG, "A='x"), "unterminated ' quote");
    }
}
