"""hyfunc: a user request plus a tool library in, function calls out."""
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import Tool, parse_tools
from hyfunc.methods import Answer, Method, load_method

__version__ = "0.1.0"
__all__ = ["Answer", "Call", "Method", "Tool", "load_method", "parse_tools", "__version__"]
