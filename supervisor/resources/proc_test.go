package resources

import "testing"

func TestViewParseStat(t *testing.T) {
	var p ProcStat
	line := "4242 (a (b) c) S 7 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 123456 1000 200 18446744073709551615\n"
	if err := parseStat([]byte(line), &p); err != nil {
		t.Fatal(err)
	}
	if p.Pid != 4242 || p.Name != "a (b) c" || p.State != "sleeping" || p.PPid != 7 || p.UTime != 250 || p.STime != 50 ||
		p.StartTicks != 123456 || p.CPUTimeUs() != 3_000_000 {
		t.Fatalf("parsed %+v", p)
	}
	parseStatus([]byte("Name:\tx\nVmRSS:\t  2048 kB\nThreads:\t5\nNSpid:\t4242\t17\n"), &p)
	if p.VMRSS != 2<<20 || p.Threads != 5 || p.NSPid != 17 {
		t.Fatalf("status %+v", p)
	}
	if err := parseStat([]byte("garbage"), &p); err == nil {
		t.Fatal("garbage parsed")
	}
}
