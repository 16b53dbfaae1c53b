import hyfunc

tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]
method = hyfunc.load_method("hyfunc")  # the shipped cascade: qwen-coder-1.5b -> qwen-coder-0.5b
answer = method.answer([{"role": "user", "content": "Weather in Oslo, in fahrenheit?"}], hyfunc.parse_tools(tools))
print(answer.calls)
