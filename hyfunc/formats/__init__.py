"""Tool schemas, function calls and their text forms, and argument validation."""
from hyfunc.formats.calls import (
    Call,
    CallParseError,
    from_openai_tool_calls,
    parse_calls,
    parse_json_calls,
    parse_python_calls,
    parse_tool_call_blocks,
    render_json_calls,
    render_python_calls,
    render_tool_call_blocks,
    to_bfcl_output,
    to_openai_tool_calls,
)
from hyfunc.formats.schema import (
    NO_DEFAULT,
    Param,
    SchemaError,
    Tool,
    parse_tool,
    parse_tools,
)
from hyfunc.formats.validate import ArgumentError, argument_errors, validate_call

__all__ = [
    "NO_DEFAULT",
    "ArgumentError",
    "Call",
    "CallParseError",
    "Param",
    "SchemaError",
    "Tool",
    "argument_errors",
    "from_openai_tool_calls",
    "parse_calls",
    "parse_json_calls",
    "parse_python_calls",
    "parse_tool",
    "parse_tool_call_blocks",
    "parse_tools",
    "render_json_calls",
    "render_python_calls",
    "render_tool_call_blocks",
    "to_bfcl_output",
    "to_openai_tool_calls",
    "validate_call",
]
