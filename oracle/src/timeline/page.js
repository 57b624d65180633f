(function(){
  var details=document.getElementById('details-text');
  var selected=null;
  function show(el){
    var t=el.querySelector(':scope > title');
    if(!t)return;
    if(selected)selected.classList.remove('selected');
    selected=el;el.classList.add('selected');
    details.textContent=t.textContent;
  }
  document.getElementById('timeline').addEventListener('click',function(ev){
    var el=ev.target.closest('.finding, .arrow, .row, .seg');
    if(el)show(el);
  });
  window.kvsimJump=function(ev){
    var f=document.getElementById('first-violation');
    if(!f)return;
    if(ev)ev.preventDefault();
    show(f);
    var y=f.getBoundingClientRect().top+window.scrollY-window.innerHeight/3;
    window.scrollTo(0,Math.max(0,y));
  };
  var first=document.getElementById('first-violation');
  if(first){show(first);}
  var n=function(s){return document.querySelectorAll(s).length;};
  document.getElementById('drawn').textContent='In this browser: '+n('#heads .lane')+' lanes, '+n('#timeline .arrow')+' arrows, '+n('#timeline .finding.violation')+' violation markers, '+n('#timeline .finding.detection')+' detection markers.';
  document.body.setAttribute('data-script','ran');
})();
