package main

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestREADMETableIsRendered: the measured table of hack/lab/README.md is
// exactly what runs.tsv renders to (make lab-timings writes it).
func TestREADMETableIsRendered(t *testing.T) {
	data, err := os.ReadFile("runs.tsv")
	if err != nil {
		t.Fatal(err)
	}
	runs, err := parseRuns(string(data))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := replaceSection(string(readme), render(runs))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, string(readme)); diff != "" {
		t.Errorf("hack/lab/README.md's timings are not runs.tsv's (run make lab-timings) (-rendered +README):\n%s", diff)
	}
}

const sample = "2026-12-01T23:00:00Z\tlab\t-\tcached\twarm\t20\t80\t104\tpass\t-\t-\t6.1.0-57-amd64\t2\t24GiB\n" +
	"2026-12-01T23:10:00Z\tlab\t-\tcached\twarm\t18\t90\t110\tpass\t-\t-\t6.1.0-57-amd64\t2\t24GiB\n" +
	"2026-12-01T23:20:00Z\te2e\tTestISCSI_(Heal|Served)\tcached\twarm\t30\t200\t240\tpass\t2/0/0\tTestB=150.5,TestA=40.0\t6.1.0-57-amd64\t2\t24GiB\n" +
	"2026-12-01T23:30:00Z\te2e\tTestISCSI_(Heal|Served)\tcached\twarm\t30\t260\t300\tpass\t2/0/0\tTestB=120.0,TestA=95.2\t6.1.0-57-amd64\t2\t24GiB\n" +
	"2026-12-01T23:40:00Z\tlab\t-\tbuilt 90s\tcold\t170\t90\t391\tpass\t-\t-\t6.1.0-57-amd64\t2\t24GiB\n" +
	"2026-12-01T23:50:00Z\tlab\t-\tcached\twarm\t20\t80\t99\tfail\t-\t-\t6.1.0-57-amd64\t2\t24GiB\n" +
	"2026-12-02T00:10:00Z\tsoak\tSOAK_MINUTES=5\tcached\twarm\t30\t700\t740\tpass\t30/4/0\tnvme-port-unlink=12.5,iscsi-stuck-session=40.0\t6.1.0-57-amd64\t2\t24GiB\n" +
	"2026-12-02T00:30:00Z\tsoak\tSOAK_MINUTES=5\tcached\twarm\t30\t700\t760\tfail\t28/5/1\tnvme-port-unlink=9.0\t6.1.0-57-amd64\t2\t24GiB\n"

func TestRender_GroupsRunsAndKeepsEachTestsSlowest(t *testing.T) {
	runs, err := parseRuns(sample)
	if err != nil {
		t.Fatal(err)
	}
	got := render(runs)
	for _, want := range []string{
		"| `make lab` | cached | warm | 2 | 104 s–110 s |  |",
		"| `make lab` | built | cold | 1 | 6.5 min | image build 90s |",
		"| `make e2e E2E_RUN='TestISCSI_(Heal\\|Served)'` | cached | warm | 2 | 4.0 min–5.0 min | 2 tests; slowest (max over the runs): TestB 150 s, TestA 95 s |",
		"- `make lab`, 2026-12-01: failed after 99 s",
		"2 cores, 24GiB of memory, guest kernel 6.1.0-57-amd64",
		"| `make soak SOAK_MINUTES=5` | cached | warm | 1 | 12.3 min | faults done/skipped/failed 30/4/0; longest heal (fault undone → every path live) per kind: iscsi-stuck-session 40 s, nvme-port-unlink 12 s |",
		"- `make soak SOAK_MINUTES=5`, 2026-12-02: failed after 12.7 min; faults done/skipped/failed 28/5/1; longest heal (fault undone → every path live) per kind: nvme-port-unlink 9 s",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered table lacks %q:\n%s", want, got)
		}
	}
}

// Lines with the later columns: the host's load, the retries and the
// closest wait; runs with CPU burners beside them are a row of their own.
func TestRender_LoadRetriesAndRunsUnderLoad(t *testing.T) {
	lines := "2026-12-05T10:00:00Z\te2e\t.\tcached\twarm\t10\t600\t620\tpass\t40/0/0\tTestA=100.0\t6.1.0-57-amd64\t2\t24GiB\t0.9\t0\t12.5\n" +
		"2026-12-05T11:00:00Z\te2e\t.\tcached\twarm\t10\t900\t930\tpass\t40/0/0\tTestA=150.0\t6.1.0-57-amd64\t2\t24GiB\t4.1, 2 burners\t1\t6.0\n" +
		"2026-12-05T12:00:00Z\te2e\t.\tcached\twarm\t10\t950\t970\tpass\t40/0/0\tTestA=160.0\t6.1.0-57-amd64\t2\t24GiB\t4.3, 2 burners\t0\t5.5\n"
	runs, err := parseRuns(lines)
	if err != nil {
		t.Fatal(err)
	}
	got := render(runs)
	for _, want := range []string{
		"| `make e2e` | cached | warm | 1 | 10.3 min | 1 tests; slowest (max over the runs): TestA 100 s; host load 0.9; retries 0; closest wait 1/12.5 of its limit |",
		"| `make e2e` under load | cached | warm | 2 | 15.5 min–16.2 min | 1 tests; slowest (max over the runs): TestA 160 s; host load 4.1, 4.3 (2 burners at normal priority); retries 1, 0; closest wait 1/5.5 of its limit |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered table lacks %q:\n%s", want, got)
		}
	}
}

// A kubelet lab run (hack/lab/kubelet/run.sh) records its longest steps
// where an e2e run has its tests.
func TestRender_KubeletLabRunsNameTheirLongestSteps(t *testing.T) {
	line := "2026-12-05T13:00:00Z\tkubelet-lab\t-\tcached image, cached Kubernetes\twarm\t60\t900\t990\tpass\t-\t" +
		"kube-apiserver ready (/readyz)=394.4,kubelet: node registered; pathmend registered (CSINode)=320.5,iSCSI: the session through the proxy stuck (open-iscsi #387)=80.0" +
		"\t6.1.0-57-amd64\t2\t24GiB\t5.2, 2 burners\t1\t3.7\n"
	runs, err := parseRuns(line)
	if err != nil {
		t.Fatal(err)
	}
	want := "| `make kubelet-lab` under load | cached image, cached Kubernetes | warm | 1 | 16.5 min | longest steps (max over the runs): kube-apiserver ready (/readyz) 394 s; kubelet: node registered; pathmend registered (CSINode) 320 s; iSCSI: the session through the proxy stuck (open-iscsi #387) 80 s; host load 5.2 (2 burners at normal priority); retries 1; closest wait 1/3.7 of its limit |"
	if got := render(runs); !strings.Contains(got, want) {
		t.Errorf("rendered table lacks %q:\n%s", want, got)
	}
}

func TestParseRuns_RejectsBadLines(t *testing.T) {
	for _, bad := range []string{"a\tb\n", strings.Replace(sample, "\t104\t", "\tx\t", 1), strings.Replace(sample, "TestB=150.5", "TestB150", 1)} {
		if _, err := parseRuns(bad); err == nil {
			t.Errorf("parseRuns accepted %q", bad[:20])
		}
	}
}

func TestAddNew_AppendsOnlyUnseenLines(t *testing.T) {
	got := addNew("a\nb\n", "b\nc\n\nc\n")
	if got != "a\nb\nc\n" {
		t.Errorf("addNew = %q", got)
	}
}
