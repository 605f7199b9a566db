"""From a request body to the prompt an engine will see: the text it renders (chat template,
Anthropic Messages, Responses input, SGLang's own chat rendering) or the token ids the client
sent, exactly as the engine does, or a clear reason it cannot be (``unrenderable``). Pure."""
