package main

import (
	"bytes"
	"strings"
	"testing"
)

// A go test -json stream: a pass, a skip with its reason, a failure with its
// output, a package line. The report prints the failure and the package
// line, not the passing test's output, and lists the skip with its reason.
func TestReport(t *testing.T) {
	stream := `{"Action":"run","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"    noisy\n"}
{"Action":"pass","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Test":"TestTool","Output":"=== RUN   TestTool\n"}
{"Action":"output","Package":"p","Test":"TestTool","Output":"    x_test.go:9: chromium not found\n"}
{"Action":"output","Package":"p","Test":"TestTool","Output":"--- SKIP: TestTool (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestTool"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"    x_test.go:12: want 1, got 2\n"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestBad"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.01s\n"}
{"Action":"fail","Package":"p"}
{"Action":"skip","Package":"q"}
not json
`
	var out bytes.Buffer
	r := &report{out: &out, output: map[key][]string{}}
	if err := r.read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	r.summary()
	got := out.String()
	for _, want := range []string{"want 1, got 2", "--- FAIL: TestBad", "FAIL\tp\t0.01s", "not json",
		"skipped: 1 tests\n  p TestTool: x_test.go:9: chromium not found\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "noisy") {
		t.Errorf("a passing test's output is printed:\n%s", got)
	}
	if !r.failed {
		t.Error("a failed test is not a failure")
	}
}

func TestReportNothingSkipped(t *testing.T) {
	var out bytes.Buffer
	r := &report{out: &out, output: map[key][]string{}}
	r.read(strings.NewReader(`{"Action":"pass","Package":"p","Test":"TestOK"}` + "\n"))
	r.summary()
	if out.String() != "skipped: none\n" || r.failed {
		t.Fatalf("%q failed=%v", out.String(), r.failed)
	}
}

// A package that times out (or crashes) ends with a package-level fail while
// tests are still running: go test's panic and goroutine dump go to those
// tests, which never end. The report prints what they said, since that is
// the only account of where the package hung.
func TestReportPackageTimeout(t *testing.T) {
	stream := `{"Action":"run","Package":"p","Test":"TestHangs"}
{"Action":"output","Package":"p","Test":"TestHangs","Output":"=== RUN   TestHangs\n"}
{"Action":"output","Package":"p","Test":"TestHangs","Output":"panic: test timed out after 10m0s\n"}
{"Action":"output","Package":"p","Test":"TestHangs","Output":"goroutine 7 [chan receive]:\n"}
{"Action":"run","Package":"q","Test":"TestOther"}
{"Action":"output","Package":"q","Test":"TestOther","Output":"=== RUN   TestOther\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t600.4s\n"}
{"Action":"fail","Package":"p"}
`
	var out bytes.Buffer
	r := &report{out: &out, output: map[key][]string{}}
	if err := r.read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"unfinished in p: TestHangs", "panic: test timed out after 10m0s", "goroutine 7 [chan receive]"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "TestOther") {
		t.Errorf("another package's running test is printed:\n%s", got)
	}
}
