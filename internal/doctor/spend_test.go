package doctor

import (
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
)

func TestCheckSpendNamesUnpricedRoutes(t *testing.T) {
	f, err := config.Parse("klbr.toml", []byte("[routes.main]\nurl = \"http://x/v1\"\nmodel = \"m\"\nprice = { input = 1, output = 2 }\n"+
		"[routes.local]\nurl = \"http://y/v1\"\nmodel = \"l\"\n[spend]\ndaily_tokens = 1000\n"))
	if err != nil {
		t.Fatal(err)
	}
	c := checkSpend(&f)
	if !c.OK || !c.Warn || !strings.Contains(c.Detail, "local have no price") || strings.Contains(c.Detail, "main,") ||
		!strings.Contains(c.Detail, "daily 1000 tokens") {
		t.Fatalf("%+v", c)
	}
	f.Routes["local"] = f.Routes["main"]
	if c := checkSpend(&f); c.Warn || !strings.Contains(c.Detail, "every route has a price") {
		t.Fatalf("%+v", c)
	}
}
