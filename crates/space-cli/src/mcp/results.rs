//! What the tools hand back: API answers shaped for a model (bounded output, file bytes as
//! text or base64, permission bits in octal), and errors as tool errors.

use base64::Engine;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};
use space_api::ExecResult;

use super::api::CallResult;

/// A tool's outcome: the JSON of a success, or the error (code, message, status) with
/// `isError: true`, which the model sees and can act on (a protocol error it would not).
pub fn tool_result(outcome: CallResult<Value>) -> CallToolResult {
    match outcome {
        Ok(value) => CallToolResult::structured(value),
        Err(e) => CallToolResult::structured_error(e.to_json()),
    }
}

/// A command's result with each stream cut to `max` bytes (its start and its end kept).
pub fn exec_result(result: ExecResult, max: usize) -> Value {
    let (stdout, mut stdout_cut) = clip(&result.stdout, max);
    let (stderr, mut stderr_cut) = clip(&result.stderr, max);
    // The server cut a stream at 16 MiB (its JSON size); `max` is far below, so that stream
    // was cut here too. If not, which one it was is unknown: flag both.
    if result.truncated && !stdout_cut && !stderr_cut {
        (stdout_cut, stderr_cut) = (true, true);
    }
    json!({
        "exit_code": result.exit_code,
        "signal": result.signal,
        "timed_out": result.timed_out,
        "oom_killed": result.oom_killed,
        "stdout": stdout,
        "stderr": stderr,
        "stdout_truncated": stdout_cut,
        "stderr_truncated": stderr_cut,
        "duration_ms": result.duration_ms,
    })
}

/// A background command's result: what is known at once.
pub fn background_result(result: ExecResult) -> Value {
    json!({ "pid": result.pid, "background": true })
}

/// `text` cut to at most `max` bytes: its first and last halves around a marker saying how
/// much is missing (errors tend to be at the end of an output, context at its start).
pub fn clip(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    let head = floor_char_boundary(text, max / 2);
    let tail = ceil_char_boundary(text, text.len() - (max - head));
    let omitted = tail - head;
    (format!("{}\n[… {omitted} bytes omitted …]\n{}", &text[..head], &text[tail..]), true)
}

fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// A file's bytes as `utf-8` text when they are, `base64` otherwise. A cut that split the
/// last character does not make a text file binary: the partial character is dropped.
pub fn file_content(path: &str, data: &[u8], truncated: bool) -> Value {
    let text = match std::str::from_utf8(data) {
        Ok(text) => Some(text),
        Err(e) if truncated && e.error_len().is_none() => std::str::from_utf8(&data[..e.valid_up_to()]).ok(),
        Err(_) => None,
    };
    let (encoding, content) = match text {
        Some(text) => ("utf-8", text.to_owned()),
        None => ("base64", base64::engine::general_purpose::STANDARD.encode(data)),
    };
    json!({ "path": path, "encoding": encoding, "content": content, "bytes": data.len(), "truncated": truncated })
}

/// A directory listing with each entry's `mode` as octal permission bits (`"644"`), the way
/// people and `chmod` write them, instead of a decimal number.
pub fn file_list(mut list: Value) -> Value {
    if let Some(entries) = list.get_mut("entries").and_then(Value::as_array_mut) {
        for entry in entries {
            if let Some(mode) = entry.get("mode").and_then(Value::as_u64) {
                entry["mode"] = format!("{:o}", mode & 0o7777).into();
            }
        }
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        assert_eq!(clip("hi\n", 10), ("hi\n".to_owned(), false));
        assert_eq!(clip("", 0), (String::new(), false));
    }

    #[test]
    fn long_output_keeps_its_start_and_end() {
        let text: String = (0..1000).map(|i| format!("{i}\n")).collect();
        let (clipped, cut) = clip(&text, 100);
        assert!(cut);
        assert!(clipped.starts_with("0\n1\n2\n"), "{clipped}");
        assert!(clipped.ends_with("998\n999\n"), "{clipped}");
        let omitted = text.len() - 100;
        assert!(clipped.contains(&format!("[… {omitted} bytes omitted …]")), "{clipped}");
    }

    #[test]
    fn clipping_never_splits_a_character() {
        let text = "é".repeat(100); // 2 bytes each
        for max in 1..20 {
            let (clipped, cut) = clip(&text, max);
            assert!(cut);
            let kept = clipped.replace(|c| c != 'é', "");
            assert!(kept.len() <= max, "max {max}: kept {}", kept.len());
        }
    }

    #[test]
    fn a_server_cut_is_flagged_even_when_no_stream_was_cut_here() {
        let result = ExecResult { stdout: "x".into(), truncated: true, ..Default::default() };
        let value = exec_result(result, 1024);
        assert_eq!(
            (value["stdout_truncated"].as_bool(), value["stderr_truncated"].as_bool()),
            (Some(true), Some(true))
        );
        let value = exec_result(ExecResult { stdout: "x".repeat(2000), ..Default::default() }, 1024);
        assert_eq!(
            (value["stdout_truncated"].as_bool(), value["stderr_truncated"].as_bool()),
            (Some(true), Some(false))
        );
    }

    #[test]
    fn exec_results_carry_exit_code_and_output() {
        let result =
            ExecResult { exit_code: Some(3), stdout: "hi\n".into(), stderr: "oops".into(), ..Default::default() };
        let value = exec_result(result, 1024);
        assert_eq!(value["exit_code"], 3);
        assert_eq!(value["stdout"], "hi\n");
        assert_eq!(value["stderr"], "oops");
        assert_eq!(value["timed_out"], false);
    }

    #[test]
    fn text_files_are_text_and_binary_files_base64() {
        let text = file_content("/a", b"hello\n", false);
        assert_eq!((text["encoding"].as_str(), text["content"].as_str()), (Some("utf-8"), Some("hello\n")));
        let binary = file_content("/b", &[0xff, 0x00, 0x80], false);
        assert_eq!((binary["encoding"].as_str(), binary["content"].as_str()), (Some("base64"), Some("/wCA")));
        assert_eq!(binary["bytes"], 3);
    }

    #[test]
    fn a_text_file_cut_inside_a_character_stays_text() {
        let cut = &"aé".as_bytes()[..2];
        let value = file_content("/a", cut, true);
        assert_eq!((value["encoding"].as_str(), value["content"].as_str()), (Some("utf-8"), Some("a")));
        // Not cut: the same bytes are not valid text.
        assert_eq!(file_content("/a", cut, false)["encoding"], "base64");
    }

    #[test]
    fn listings_show_modes_in_octal() {
        let list = json!({"entries": [{"name": "a", "mode": 0o100755}, {"name": "b", "mode": 0o644}]});
        let shaped = file_list(list);
        assert_eq!(shaped["entries"][0]["mode"], "755");
        assert_eq!(shaped["entries"][1]["mode"], "644");
    }

    #[test]
    fn errors_are_tool_errors_with_code_and_message() {
        let result = tool_result(Err(super::super::api::api_error(
            404,
            r#"{"error":{"code":"not_found","message":"no session ses_x"}}"#,
        )));
        assert_eq!(result.is_error, Some(true));
        let body = result.structured_content.expect("structured");
        assert_eq!(body["error"]["code"], "not_found");
        assert_eq!(body["error"]["message"], "no session ses_x");
    }
}
