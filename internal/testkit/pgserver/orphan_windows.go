package pgserver

import (
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"
)

// dieWithParent does nothing before the start: watchParent puts the process in
// a job object once it runs.
func dieWithParent(*syscall.SysProcAttr, syscall.Signal) {}

// watchParent assigns p to a new job object that kills its processes when its
// last handle closes. This process holds the only handle, so the system kills
// the server when this process dies, however it dies; the processes the server
// starts afterwards (PostgreSQL's backends) belong to the job too. release,
// called once p has exited, kills whatever of the job is left and waits (up to
// 10s) until it has exited, so that a restarted server finds no backend of the
// old one still holding its shared memory.
func watchParent(p *os.Process, _ syscall.Signal) (release func(), err error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return nil, fmt.Errorf("create a job object: %w", err)
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{
		BasicLimitInformation: windows.JOBOBJECT_BASIC_LIMIT_INFORMATION{
			LimitFlags: windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
		},
	}
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		windows.CloseHandle(job)
		return nil, fmt.Errorf("set the job object's limits: %w", err)
	}
	h, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(p.Pid))
	if err != nil {
		windows.CloseHandle(job)
		return nil, fmt.Errorf("open process %d: %w", p.Pid, err)
	}
	defer windows.CloseHandle(h)
	if err := windows.AssignProcessToJobObject(job, h); err != nil {
		windows.CloseHandle(job)
		return nil, fmt.Errorf("assign process %d to the job object: %w", p.Pid, err)
	}
	return func() {
		_ = windows.TerminateJobObject(job, 1)
		waitJobEmpty(job, 10*time.Second)
		windows.CloseHandle(job)
	}, nil
}

// jobAccounting is JOBOBJECT_BASIC_ACCOUNTING_INFORMATION.
type jobAccounting struct {
	TotalUserTime, TotalKernelTime, ThisPeriodTotalUserTime, ThisPeriodTotalKernelTime int64
	TotalPageFaultCount, TotalProcesses, ActiveProcesses, TotalTerminatedProcesses     uint32
}

// waitJobEmpty waits until no process of job is running, or timeout has passed.
func waitJobEmpty(job windows.Handle, timeout time.Duration) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var info jobAccounting
		if windows.QueryInformationJobObject(job, windows.JobObjectBasicAccountingInformation,
			uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info)), nil) != nil || info.ActiveProcesses == 0 {
			return
		}
	}
}
