package setup

import (
	"errors"
	"io/fs"
	"os"
)

// ConfigTemplate is the klbr.toml init writes where there is none: every
// setting commented out, so it changes nothing until the operator edits it.
const ConfigTemplate = `# klbr.toml — read by klbr-core and klbr-discord. Every section is optional;
# an error names the line and key. See docs/agent.md and docs/operating.md.

# The agent runs once [agent].route names a route (default "main").
# [agent]
# route = "main"
# max_steps = 40                  # model requests per attempt
# max_turn_seconds = 3600
# context_budget_tokens = 100000  # history is never silently truncated
# (fallback, a list of route names, says where a step goes when its route fails transiently)

# Any OpenAI-compatible /chat/completions server. Check it: klbr-core doctor,
# klbr-core route test main.
# [routes.main]
# url = "http://localhost:8001/v1"  # the API's base URL, not …/chat/completions
# model = "local"
# dialect = "openai"              # or deepseek, mistral, llama.cpp, vllm, ollama, openrouter
# api_key_env = "OPENAI_API_KEY"  # or api_key_file = "/run/credentials/…"; never the key itself

# [limits]
# memory_max = "2G"
# tasks_max = 256
# cpu_quota = "200%"
`

// WriteConfigTemplate writes ConfigTemplate at path unless a file is
// there, and reports whether it wrote it. init calls it for the default
// <data>/klbr.toml only: a KLBR_CONFIG someone chose (the NixOS module
// renders one) is theirs.
func WriteConfigTemplate(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := f.WriteString(ConfigTemplate); err != nil {
		f.Close()
		os.Remove(path)
		return false, err
	}
	return true, f.Close()
}
